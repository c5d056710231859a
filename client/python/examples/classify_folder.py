#!/usr/bin/env python3
"""Classifies every PNG in a folder, in calls of up to 64 images, and prints each file's label.

    python classify_folder.py samples/ [--server localhost:50051] [--model krause-vit-fmnist]
"""
import argparse
import pathlib

from krause_serve import Client, KrauseError


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=pathlib.Path)
    p.add_argument("--server", default="localhost:50051")
    p.add_argument("--model", default="", help="a classifier (empty: the default one)")
    p.add_argument("--token", default=None)
    args = p.parse_args()
    files = sorted(args.folder.glob("*.png"))
    with Client(args.server, token=args.token) as client:
        for start in range(0, len(files), 64):
            batch = files[start:start + 64]
            try:
                result = client.classify(batch, model=args.model, top_k=3)
            except KrauseError as e:  # e.field names the image ("images[3]")
                raise SystemExit(f"{args.folder}: {e.message}")
            for path, c in zip(batch, result):
                top = "  ".join(f"{s.label or s.index} {s.probability:.3f}" for s in c.top)
                print(f"{path.name}: {top}")


if __name__ == "__main__":
    main()
