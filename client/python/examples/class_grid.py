#!/usr/bin/env python3
"""Generates a grid with a row per class of a conditional generator (each row n images, one
call per class, all in flight at once on AsyncClient) and saves it as one PNG.

    python class_grid.py grid.png [--server localhost:50051] [--n 8] [--seed 1] [--guidance 2]
"""
import argparse
import asyncio

import numpy as np
from PIL import Image

from krause_serve import AsyncClient


async def grid(args):
    async with AsyncClient(args.server, token=args.token) as client:
        model = await client.model(args.model) if args.model else next(
            m for m in await client.models() if m.kind == "generator" and m.is_default)
        if not model.classes:
            raise SystemExit(f"{model.name} is unconditional: it has no classes to draw")
        rows = await asyncio.gather(*[
            client.generate_images(model=model.name, n=args.n, seed=args.seed, class_index=c,
                                   guidance=args.guidance)
            for c in range(model.classes)])
    return model, np.concatenate([np.concatenate([g.array for g in r], axis=1) for r in rows])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--server", default="localhost:50051")
    p.add_argument("--model", default="", help="a conditional generator (empty: the default)")
    p.add_argument("--n", type=int, default=8, help="images per class")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--scale", type=int, default=4, help="pixels per image pixel")
    p.add_argument("--token", default=None)
    args = p.parse_args()
    model, pixels = asyncio.run(grid(args))
    image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
    image = image.resize((image.width * args.scale, image.height * args.scale), Image.NEAREST)
    image.save(args.out)
    print(f"{args.out}: {model.classes} classes of {model.name} ({', '.join(model.labels)}), "
          f"{args.n} each, seed {args.seed}")


if __name__ == "__main__":
    main()
