"""Generate tasks.jsonl: arithmetic word problems for the calc example (fixed seed, so the file never changes).

    python make_tasks.py            # writes tasks.jsonl next to this script
    python make_tasks.py --n 400 --out /tmp/tasks.jsonl
    python make_tasks.py --kinds mul --n 120 --seed 7 --out ../quickstart/tasks.jsonl   # the quickstart's tasks

Each line: {"id": "calc-0001", "question": ..., "answer": <int>, "split": "train"|"val"|"test", "ops": [...],
"expression": ..., "kind": ...}. Every problem needs at least one multiplication or 3-digit sum that a 135M model
cannot do in its head, and most need two or more steps. Splits cycle train, val, train, test, so every split gets
the same mix of kinds (about 50% / 25% / 25%).
"""

import argparse
import json
import random
import re
from pathlib import Path

SEED = 20240611
SPLITS = ["train", "val", "train", "test"]

ITEMS = [("box", "boxes", "pencils"), ("crate", "crates", "apples"), ("bag", "bags", "marbles"),
         ("shelf", "shelves", "books"), ("tray", "trays", "cookies"), ("pack", "packs", "stickers"),
         ("carton", "cartons", "eggs"), ("jar", "jars", "candies")]
GOODS = [("notebook", "notebooks"), ("ticket", "tickets"), ("shirt", "shirts"), ("lamp", "lamps"),
         ("chair", "chairs"), ("book", "books"), ("plant", "plants"), ("mug", "mugs")]
NAMES = ["Ana", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Leo"]
PLACES = ["library", "warehouse", "school", "bakery", "farm", "museum", "store", "factory"]


def kind_mul(r: random.Random) -> tuple[str, str]:
    a, b = r.randint(12, 99), r.randint(12, 99) if r.random() < 0.7 else r.randint(102, 399)
    one, many, thing = r.choice(ITEMS)
    return r.choice([
        f"Each {one} holds {a} {thing}. How many {thing} are in {b} {many}?",
        f"A {r.choice(PLACES)} has {b} {many} with {a} {thing} in each. How many {thing} is that in total?",
    ]), f"{a} * {b}"


def kind_mul_add(r: random.Random) -> tuple[str, str]:
    a, b, c = r.randint(12, 99), r.randint(12, 99), r.randint(15, 499)
    one, many, thing = r.choice(ITEMS)
    name = r.choice(NAMES)
    return r.choice([
        f"Each {one} holds {a} {thing}. {name} has {b} {many} and {c} loose {thing}. "
        f"How many {thing} does {name} have?",
        f"A {r.choice(PLACES)} fills {b} {many} with {a} {thing} each and keeps {c} more {thing} aside. "
        f"How many {thing} are there altogether?",
    ]), f"{a} * {b} + {c}"


def kind_mul_sub(r: random.Random) -> tuple[str, str]:
    a, b = r.randint(12, 99), r.randint(12, 99)
    c = r.randint(10, a * b - 1)
    one, many, thing = r.choice(ITEMS)
    name = r.choice(NAMES)
    return r.choice([
        f"Each {one} holds {a} {thing}. {name} buys {b} {many} and gives away {c} {thing}. "
        f"How many {thing} are left?",
        f"There are {b} {many} holding {a} {thing} each. If {c} {thing} are sold, how many {thing} remain?",
    ]), f"{a} * {b} - {c}"


def kind_add3(r: random.Random) -> tuple[str, str]:
    a, b, c = r.randint(120, 899), r.randint(120, 899), r.randint(120, 899)
    place, name = r.choice(PLACES), r.choice(NAMES)
    return r.choice([
        f"A {place} had {a} visitors on Friday, {b} on Saturday and {c} on Sunday. "
        f"How many visitors came in those three days?",
        f"{name} walked {a} meters, then {b} meters, then {c} meters. How many meters did {name} walk?",
    ]), f"{a} + {b} + {c}"


def kind_add_sub(r: random.Random) -> tuple[str, str]:
    a, b = r.randint(120, 899), r.randint(120, 899)
    c = r.randint(100, a + b - 50)
    place = r.choice(PLACES)
    return r.choice([
        f"A tank holds {a} liters. {b} liters are added, then {c} liters are drained. How many liters are in it now?",
        f"A {place} had {a} chairs, bought {b} more and then sold {c}. How many chairs does it have now?",
    ]), f"{a} + {b} - {c}"


def kind_two_products(r: random.Random) -> tuple[str, str]:
    a, b, c, d = r.randint(11, 95), r.randint(3, 29), r.randint(11, 95), r.randint(3, 29)
    (_, g1s), (_, g2s) = r.sample(GOODS, 2)
    name = r.choice(NAMES)
    return r.choice([
        f"{g1s.capitalize()} cost ${a} each and {g2s} cost ${c} each. {name} buys {b} {g1s} and {d} {g2s}. "
        f"How many dollars does {name} spend?",
        f"A {r.choice(PLACES)} sold {b} {g1s} for ${a} each and {d} {g2s} for ${c} each. "
        f"How many dollars did it take in?",
    ]), f"{a} * {b} + {c} * {d}"


def kind_sum_times(r: random.Random) -> tuple[str, str]:
    a, b, c = r.randint(12, 99), r.randint(12, 99), r.randint(7, 49)
    name = r.choice(NAMES)
    return r.choice([
        f"{name} reads {a} pages in the morning and {b} pages in the evening, every day for {c} days. "
        f"How many pages does {name} read?",
        f"A {r.choice(PLACES)} receives {a} parcels before noon and {b} after noon each day. "
        f"How many parcels arrive in {c} days?",
    ]), f"({a} + {b}) * {c}"


def kind_three_factors(r: random.Random) -> tuple[str, str]:
    a, b, c = r.randint(12, 48), r.randint(6, 24), r.randint(3, 12)
    one, many, thing = r.choice(ITEMS)
    return r.choice([
        f"Each {one} holds {a} {thing}. A pallet carries {b} {many}. How many {thing} are on {c} pallets?",
        f"Each {one} holds {a} {thing}, each room has {b} {many}, and the {r.choice(PLACES)} has {c} rooms. "
        f"How many {thing} are there?",
    ]), f"{a} * {b} * {c}"


# How often each kind comes up: about half are single products (a 135M model gets these right only with the
# calculator and a good prompt), the rest need two or three operations.
KINDS = {
    "mul": (kind_mul, 7), "mul_add": (kind_mul_add, 2), "mul_sub": (kind_mul_sub, 1), "add3": (kind_add3, 1),
    "add_sub": (kind_add_sub, 1), "two_products": (kind_two_products, 1), "sum_times": (kind_sum_times, 1),
    "three_factors": (kind_three_factors, 1),
}


def make_tasks(n: int, seed: int = SEED, kinds: list[str] | None = None) -> list[dict]:
    """`n` tasks of `kinds` (default: all, in their proportions), taken in turn so every split gets the same mix."""
    r = random.Random(seed)
    cycle = [name for name, (_, weight) in KINDS.items() if kinds is None or name in kinds for _ in range(weight)]
    tasks = []
    for i in range(n):
        kind = cycle[(i // len(SPLITS)) % len(cycle)]
        question, expression = KINDS[kind][0](r)
        tasks.append({
            "id": f"calc-{i + 1:04d}", "question": question, "answer": int(eval(expression)),  # our own expression
            "split": SPLITS[i % len(SPLITS)], "ops": sorted({t for t in expression if t in "+-*"}),
            "operands": len(re.findall(r"\d+", expression)), "kind": kind,
            "expression": expression,
        })
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=360)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "tasks.jsonl")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), help="only these kinds of problem (default: all)")
    args = parser.parse_args()
    tasks = make_tasks(args.n, args.seed, args.kinds)
    args.out.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    print(f"wrote {len(tasks)} tasks to {args.out}")


if __name__ == "__main__":
    main()
