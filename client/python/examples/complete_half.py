#!/usr/bin/env python3
"""Keeps the top half of an image and lets a generator sample the rest, several times; shows
the rows as they arrive and saves the original beside the completions.

    python complete_half.py shoe.png out.png [--server localhost:50051] [--n 4] [--seed 1]
"""
import argparse

import numpy as np
from PIL import Image

from krause_serve import Client, GeneratedImage, Rows, Summary


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("image")
    p.add_argument("out")
    p.add_argument("--server", default="localhost:50051")
    p.add_argument("--model", default="", help="a generator (empty: the default one)")
    p.add_argument("--n", type=int, default=4, help="completions")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--token", default=None)
    args = p.parse_args()
    original = Image.open(args.image)
    with Client(args.server, token=args.token) as client:
        model = client.model(args.model) if args.model else next(
            m for m in client.models() if m.kind == "generator" and m.is_default)
        height = model.shape[0]
        done = {}
        for event in client.generate(model=model.name, n=args.n, seed=args.seed, prompt=original,
                                     prompt_rows=height // 2):
            if isinstance(event, Rows):
                print(f"\rimage {event.image}: row {event.first_row + len(event.pixels)} of "
                      f"{height}", end="", flush=True)
            elif isinstance(event, GeneratedImage):
                done[event.image] = event.array
            elif isinstance(event, Summary):
                print(f"\n{event.images} completions in {event.seconds:.2f} s (seed {event.seed})")
    first = np.asarray(original.convert("L" if model.shape[2] == 1 else "RGB"))
    first = first[:, :, None] if first.ndim == 2 else first
    strip = np.concatenate([first] + [done[i] for i in sorted(done)], axis=1)
    Image.fromarray(strip[:, :, 0] if strip.shape[2] == 1 else strip).save(args.out)
    print(f"{args.out}: the original, then {len(done)} completions of its top {height // 2} rows")


if __name__ == "__main__":
    main()
