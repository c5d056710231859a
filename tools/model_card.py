#!/usr/bin/env python3
"""Writes a model card (Markdown) from a krause-train summary.json.

Usage: python3 tools/model_card.py train-runs/krause_vit/summary.json > models/krause_vit_fmnist.md
       python3 tools/model_card.py SUMMARY NAME [--grid FILE.png] [EVAL_REPORT.json ...]

Generators: each krause-eval report.json given adds a row to a sample-quality table (the first
one also its per-class table); --grid names the grid image to show (a path relative to the card).
"""
import json
import sys


def fmt_flops(x):
    return f"{x / 1e6:.2f} MFLOPs"


def eval_section(name, reports, grid):
    """The sample-quality section of a generator's card from krause-eval reports."""
    lines = ["", "## Sample quality (`krause-eval`)", ""]
    first = reports[0]
    lines += ["Measured by the project's own evaluation command with the bundled Krause ViT as the judge "
              f"({first['samples']} samples, image i with seed {first['seed']} + i"
              + (", class i % classes" if first["conditional"] else "") +
              f"; {first['real_images']} real test images; the floor is the distance between two "
              "disjoint sets of real test images):", "",
              "```sh"]
    for r in reports:
        g = r.get("guidance", 1.0)
        lines.append(f"build/bin/krause-eval --generator models/{name.replace('-', '_')}.safetensors "
                     f"--samples {r['samples']}" + (f" --guidance {g:g}" if g != 1.0 else "")
                     + (f" --top_p {r['top_p']:g}" if r.get("top_p", 1.0) != 1.0 else "")
                     + (f" --top_k {r['top_k']}" if r.get("top_k", 0) else "")
                     + ("" if "bits_per_dim_unconditional" in r else " --bits_per_dim=false"))
    lines += ["```", "",
              "| guidance | top_p | class agreement | Frechet distance (floor) | mean top-1 probability (real) | "
              "bits/dim, whole test set | sampling seconds |",
              "|---|---|---|---|---|---|---|"]
    for r in reports:
        agree = (f"{100 * r['assigned_to_requested_class_mean']:.1f}%"
                 if "assigned_to_requested_class_mean" in r else "-")
        if "bits_per_dim_conditional" in r:
            bpd = f"{r['bits_per_dim_conditional']:.4f} given the class, {r['bits_per_dim_unconditional']:.4f} without"
        elif "bits_per_dim_unconditional" in r:
            bpd = f"{r['bits_per_dim_unconditional']:.4f}"
        else:
            bpd = "-"
        lines.append(f"| {r.get('guidance', 1.0):g} | {r.get('top_p', 1.0):g} | {agree} | {r['frechet_distance']:.2f} "
                     f"({r['frechet_distance_real_floor']:.2f}) | {r['mean_top1_probability_samples']:.3f} "
                     f"({r['mean_top1_probability_real']:.3f}) | {bpd} | {r['sampling_seconds']:.0f} |")
    if "classifier_accuracy_real" in first:
        lines += ["", f"The judge's own accuracy on those real test images: "
                      f"{100 * first['classifier_accuracy_real']:.1f}%."]
    if "assigned_to_requested_class" in first:
        lines += ["", f"Per class (guidance {first.get('guidance', 1.0):g}, top_p {first.get('top_p', 1.0):g}):", "",
                  "| class | assigned to it |", "|---|---|"]
        for c in first["assigned_to_requested_class"]:
            lines.append(f"| {c['label']} | {100 * c['assigned']:.0f}% |")
    if grid:
        lines += ["", f"![samples, one row per class]({grid})"]
    return lines


def use_section(classifier, labels):
    """Intended use, limitations, data and licence: the same for every bundled card, by kind."""
    what = ("classifies 28x28 gray images in Fashion-MNIST's style into its 10 clothing classes"
            if classifier else
            "draws 28x28 gray images of Fashion-MNIST's 10 clothing classes, one subpixel at a time")
    lines = ["", "## Intended use", "",
             f"A reference model: it {what}. It is bundled so that krause-serve can be tried, "
             "tested and benchmarked without a download (Krause attention against its softmax "
             "baseline, the serving paths, the protocols), and as a worked example of training "
             "and evaluating one. It is not meant for decisions about people, products or "
             "anything outside that data set.",
             "", "## Limitations", "",
             "- It knows Fashion-MNIST only: centred, light-on-dark 28x28 gray product images. "
             "Anything else of that shape (photographs, sketches, inverted or off-centre images) "
             "gets an answer as confident as any other and as meaningless; the server checks an "
             "image's shape, never its content."]
    if classifier:
        lines.append("- Its accuracy is the test figure above, on the whole test set; per-class "
                     "accuracy and calibration have not been measured for this card.")
    else:
        lines.append("- It is small (tens of thousands of parameters): samples are coarse, and "
                     "the classes that look alike in the data (shirt, coat, pullover, T-shirt/top) "
                     "are the ones it mixes up; the figures above and below say how often.")
    lines += ["- The weights are stored in fp16; the figures above are the stored weights', "
              "checked by `tests/bundled_models_test.cc`.",
              "", "## Data and licence", "",
              "Trained and evaluated on Fashion-MNIST (Zalando SE, 2017; MIT licence), as "
              "Debian's `dataset-fashion-mnist` ships it: 60,000 training and 10,000 test images "
              "of clothing from Zalando's catalogue, with nothing added"
              + (" (random crops and flips during training)." if classifier else ".")
              + " The weights are released with the code under the Apache License 2.0 "
              "([LICENSE](../LICENSE)); the data's notice is in [README.md](README.md#licences)."]
    return lines


def main():
    args = sys.argv[1:]
    grid = None
    if "--grid" in args:
        i = args.index("--grid")
        grid = args[i + 1]
        del args[i:i + 2]
    s = json.load(open(args[0]))
    name = args[1] if len(args) > 1 else s["model"]
    reports = [json.load(open(p)) for p in args[2:]]
    cfg = s["config"]
    classifier = "test_accuracy" in s
    lines = [f"# {name}", ""]
    kind = "classifier" if classifier else "generator"
    lines.append(f"A {cfg.get('attention')} {'ViT' if classifier else 'autoregressive pixel model'} "
                 f"({kind}) trained by `krause-train` on {s['data']}.")
    lines += ["", "| | |", "|---|---|"]
    rows = [("data", f"{s['data']}: {s['train_images']} training images, evaluated on {s['test_images']} test images"),
            ("epochs", s["epochs"]), ("batch", s["batch"]), ("peak learning rate", s["lr"]),
            ("weight decay", s["weight_decay"]), ("seed", s["seed"]),
            ("parameters", f"{s['parameters']:,}"), ("storage", s["storage"]),
            ("training time", f"{s['train_seconds'] / 60:.1f} min on {s['threads']} threads"),
            ("FLOPs per image, executed", fmt_flops(s["flops_per_image_executed"])),
            ("FLOPs per image, dense-equivalent", fmt_flops(s["flops_per_image_dense_equivalent"])),
            ("FLOP saving", f"{100 * (1 - s['flops_per_image_executed'] / s['flops_per_image_dense_equivalent']):.1f}%"),
            ("selection comparisons per image", f"{s['selection_comparisons_per_image']:,.0f} (not in the FLOPs)")]
    if classifier:
        rows.append(("test accuracy (as stored)", f"{100 * s['test_accuracy']:.2f}%"))
    elif cfg.get("classes", 0) > 0:
        rows.append(("classes", f"{cfg['classes']} ({', '.join(cfg.get('labels', []))}); "
                                f"label dropped for {100 * s.get('label_drop', 0):.0f}% of training sequences"))
        rows.append(("test bits/dim (as stored)",
                     f"{s['test_bits_per_dim']:.4f} given each image's class, "
                     f"{s['test_bits_per_dim_unconditional']:.4f} without"))
    else:
        rows.append(("test bits/dim (as stored)", f"{s['test_bits_per_dim']:.4f}"))
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += use_section(classifier, cfg.get("labels", []))
    lines += ["", "Config:", "", "```json", json.dumps(cfg, indent=1), "```", "",
              "Command:", "", "```sh", s["command"], "```", "",
              "Per epoch (test metric is accuracy or bits/dim):", "",
              "| epoch | train loss | test metric | seconds |", "|---|---|---|---|"]
    for h in s["history"]:
        lines.append(f"| {h['epoch']} | {h['train_loss']:.4f} | {h['test_metric']:.4f} | {h['train_seconds']:.0f} |")
    lines += ["", "FLOPs follow [../docs/kernels.md (FLOP accounting)]"
              "(../docs/kernels.md#flop-accounting-modelattentionflopsh): one multiply-add is 2 FLOPs; "
              "the dense-equivalent is the same model with every token visible."]
    if reports:
        lines += eval_section(name, reports, grid)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
