#!/usr/bin/env python3
"""Writes a model card (Markdown) from a krause-train summary.json.

Usage: python3 tools/model_card.py train-runs/krause_vit/summary.json > models/krause_vit_fmnist.md
"""
import json
import sys


def fmt_flops(x):
    return f"{x / 1e6:.2f} MFLOPs"


def main():
    s = json.load(open(sys.argv[1]))
    name = sys.argv[2] if len(sys.argv) > 2 else s["model"]
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
    lines += ["", "Config:", "", "```json", json.dumps(cfg, indent=1), "```", "",
              "Command:", "", "```sh", s["command"], "```", "",
              "Per epoch (test metric is accuracy or bits/dim):", "",
              "| epoch | train loss | test metric | seconds |", "|---|---|---|---|"]
    for h in s["history"]:
        lines.append(f"| {h['epoch']} | {h['train_loss']:.4f} | {h['test_metric']:.4f} | {h['train_seconds']:.0f} |")
    lines += ["", "FLOPs follow [../docs/kernels.md (FLOP accounting)]"
              "(../docs/kernels.md#flop-accounting-modelattentionflopsh): one multiply-add is 2 FLOPs; "
              "the dense-equivalent is the same model with every token visible."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
