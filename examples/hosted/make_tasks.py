"""Generate tasks.jsonl: short invoices, invoice e-mails and itemised receipts to pull six fields from (fixed seed).

    python make_tasks.py            # writes tasks.jsonl next to this script (36 tasks)
    python make_tasks.py --n 90 --out /tmp/tasks.jsonl

Each line: {"id": "doc-001", "kind": "invoice"|"email"|"receipt", "document": <text>, "expected": {vendor,
invoice_number, issue_date, due_date, total, currency}, "traps": [...], "split": "train"|"val"|"test"}.
Kinds cycle invoice, e-mail, receipt and each run of three shares a split, so every split gets the same mix.
Dates are written the way the sender's country writes them (03/04/2025 in the US, 3.4.2025 in Germany), amounts
too (1.234,50 EUR); due dates are sometimes only payment terms ("net 30"); e-mails mention a purchase order or an
earlier invoice number; receipts list items without a total, which must be added up. `traps` names these.
"""

import argparse
import datetime as dt
import json
import random
from pathlib import Path

SEED = 20250917
SPLITS = ["train", "val", "test"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]

# (vendor, country, currency, how the currency is written)
VENDORS = [
    ("Brightline Supplies Inc.", "US", "USD", "$"), ("Harbor & Finch LLC", "US", "USD", "$"),
    ("Nordlicht Bürotechnik GmbH", "DE", "EUR", "€"), ("Atelier Dubois SARL", "FR", "EUR", "€"),
    ("Kettleby Print Ltd", "UK", "GBP", "£"), ("Maple Ridge Software Corp.", "CA", "CAD", "CA$"),
    ("Alpenblick Consulting AG", "CH", "CHF", "CHF"), ("Sakura Components K.K.", "JP", "JPY", "¥"),
    ("Ostrava Steelworks s.r.o.", "CZ", "EUR", "EUR"), ("Greenfield Catering Ltd", "UK", "GBP", "£"),
]
CUSTOMERS = ["Lumen Analytics", "Pioneer Dental Group", "Okafor Logistics", "Vela Robotics", "Quayside Hotels",
             "Tern Studio", "Birchwood School", "Halcyon Labs"]
ITEMS = ["printer paper (10 reams)", "toner cartridge", "ergonomic chair", "USB-C dock", "conference catering",
         "annual licence", "on-site support (hours)", "shipping", "desk lamp", "network switch", "cable kit",
         "whiteboard markers"]


def money(amount: float, country: str, symbol: str) -> str:
    """An amount as the sender writes it: 1,234.50 / 1.234,50 / 1'234.50 / 45,000 (yen has no decimals)."""
    if symbol == "¥":
        return f"¥{amount:,.0f}"
    plain = f"{amount:,.2f}"
    if country in ("DE", "FR", "CZ"):
        body = plain.replace(",", "X").replace(".", ",").replace("X", ".")
        return f"{body} €" if symbol == "€" else f"{body} EUR"
    if country == "CH":
        return f"CHF {plain.replace(',', chr(39))}"
    return f"{symbol}{plain}"


def date_text(day: dt.date, country: str, r: random.Random) -> tuple[str, bool]:
    """The date as the sender's country writes it, and whether it is ambiguous without knowing the country."""
    if country == "US":
        if r.random() < 0.6:
            return f"{day.month:02d}/{day.day:02d}/{day.year}", day.day <= 12
        return f"{MONTHS[day.month - 1]} {day.day}, {day.year}", False
    if country in ("DE", "CH", "CZ"):
        return f"{day.day}.{day.month}.{day.year}", day.day <= 12
    if country == "JP":
        return f"{day.year}-{day.month:02d}-{day.day:02d}", False
    if r.random() < 0.5:
        return f"{day.day:02d}/{day.month:02d}/{day.year}", day.day <= 12
    return f"{day.day} {MONTHS[day.month - 1]} {day.year}", False


def invoice_number(r: random.Random, country: str) -> str:
    if country == "DE":
        return f"RE-{r.randint(2024, 2025)}/{r.randint(100, 999)}"
    return r.choice(
        [f"INV-{r.randint(10000, 99999)}", f"A-{r.randint(1000, 9999)}", f"{r.randint(2024, 2025)}-{r.randint(1000, 9999)}"]
    )


def make_task(r: random.Random, index: int) -> dict:
    vendor, country, currency, symbol = r.choice(VENDORS)
    customer = r.choice(CUSTOMERS)
    kind = ["invoice", "email", "receipt"][index % 3]
    traps: list[str] = []
    issued = dt.date(2025, 1, 1) + dt.timedelta(days=r.randint(0, 300))
    issued_text, ambiguous = date_text(issued, country, r)
    if ambiguous:
        traps.append("ambiguous_date")
    number = invoice_number(r, country)
    due: dt.date | None
    terms = r.random()
    if terms < 0.4:
        days = r.choice([14, 30, 45])
        due, due_text = issued + dt.timedelta(days=days), f"Payment terms: net {days} days"
        traps.append("net_terms")
    elif terms < 0.8:
        due = issued + dt.timedelta(days=r.choice([10, 21, 30]))
        due_text = f"Due date: {date_text(due, country, r)[0]}"
    else:
        due, due_text = None, "Payment: no fixed due date"
    n_items = r.randint(2, 4)
    items = [(r.choice(ITEMS), round(r.uniform(8, 900) if symbol != "¥" else r.randint(800, 90000), 2)) for _ in range(n_items)]
    if symbol == "¥":
        items = [(name, float(int(amount))) for name, amount in items]
    total = round(sum(a for _, a in items), 2)
    if country in ("DE", "FR", "CZ", "CH"):
        traps.append("local_number_format")
    if symbol == "CA$":
        traps.append("dollar_currency")
    lines = "\n".join(f"  {name:<28} {money(amount, country, symbol)}" for name, amount in items)
    if kind == "invoice":
        document = (
            f"{vendor}\nINVOICE\n\nInvoice no.: {number}\nInvoice date: {issued_text}\nBill to: {customer}\n\n"
            f"{lines}\n\nTotal due: {money(total, country, symbol)}\n{due_text}\n"
        )
    elif kind == "email":
        po = f"PO-{r.randint(4000, 9999)}"
        old = invoice_number(r, country)
        traps.append("distractor_number")
        document = (
            f"From: accounts@{vendor.split()[0].lower()}.example\nTo: ap@{customer.split()[0].lower()}.example\n"
            f"Subject: Invoice {number} for your order {po}\n\nHello {customer} team,\n\n"
            f"please find our invoice {number} dated {issued_text} attached. It replaces invoice {old}, which had "
            f"the wrong delivery address. The amount is {money(total, country, symbol)} for {n_items} items.\n"
            f"{due_text}.\n\nKind regards,\n{vendor}\n"
        )
    else:
        traps.append("sum_items")
        document = (
            f"RECEIPT / INVOICE {number}\n{vendor}\nDate: {issued_text}\nCustomer: {customer}\n\n{lines}\n\n"
            f"{due_text}\n(Amounts are final; no further charges.)\n"
        )
    expected = {
        "vendor": vendor, "invoice_number": number, "issue_date": issued.isoformat(),
        "due_date": due.isoformat() if due else None, "total": total, "currency": currency,
    }
    return {"id": f"doc-{index + 1:03d}", "kind": kind, "document": document, "expected": expected,
            "traps": traps, "split": SPLITS[(index // 3) % 3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=36)
    parser.add_argument("--out", default=str(Path(__file__).parent / "tasks.jsonl"))
    args = parser.parse_args()
    r = random.Random(SEED)
    tasks = [make_task(r, i) for i in range(args.n)]
    Path(args.out).write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks))
    print(f"wrote {len(tasks)} tasks to {args.out}")


if __name__ == "__main__":
    main()
