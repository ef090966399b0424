"""Small built-in word lists and value formats for the synthetic KIE forms (:mod:`.forms`).

Every string is drawn from a seeded :class:`numpy.random.Generator`; nothing here describes
anyone. Dates and amounts come in several printed formats, and :func:`parse_date` /
:func:`parse_amount` read every one of them back (tests check a value is what the generator
meant; an evaluation can compare extracted values rather than strings).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from decimal import Decimal

import numpy as np

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")

VENDOR_HEADS = ("Northwind", "Bluebell", "Granite", "Harbor", "Silverline", "Oakridge",
                "Maple", "Summit", "Riverside", "Crescent", "Pioneer", "Redwood", "Atlas",
                "Beacon", "Cobalt", "Evergreen", "Falcon", "Juniper", "Kestrel", "Lumen",
                "Meridian", "Nimbus", "Orchid", "Quarry", "Sterling", "Tidewater", "Vantage",
                "Willow", "Zephyr", "Copperfield")
VENDOR_TRADES = ("Traders", "Supplies", "Logistics", "Consulting", "Print Works",
                 "Electrical", "Foods", "Office Solutions", "Engineering", "Design Studio",
                 "Hardware", "Laboratories", "Catering", "Software", "Plumbing", "Media")
VENDOR_SUFFIXES = ("Ltd", "LLC", "Inc.", "GmbH", "& Co.", "S.A.", "BV", "", "", "")
FIRST_NAMES = ("Maria", "James", "Aisha", "Lukas", "Chen", "Sofia", "Omar", "Emma", "Ravi",
               "Hannah", "Mateo", "Yuki", "Grace", "Pierre", "Nadia", "Tom")
LAST_NAMES = ("Lopez", "Smith", "Khan", "Weber", "Wang", "Rossi", "Haddad", "Brown", "Patel",
              "Novak", "Garcia", "Tanaka", "Okafor", "Dubois", "Jensen", "Murphy")
STREETS = ("High Street", "Market Road", "Station Road", "Church Lane", "Mill Lane",
           "Park Avenue", "Oak Street", "King Street", "Harbour Way", "Elm Drive",
           "Bridge Street", "Queens Road", "Victoria Street", "Lake View", "Hill Road")
CITIES = ("Leeds", "Bristol", "Springfield", "Portland", "Hamburg", "Lyon", "Utrecht",
          "Dublin", "Toronto", "Austin", "Denver", "Glasgow", "Basel", "Ghent", "Porto")
ITEMS = ("Printer paper A4", "Toner cartridge", "Consulting hours", "Office chair",
         "Desk lamp", "USB-C cable", "Software licence", "Maintenance visit",
         "Delivery charge", "Cleaning service", "Coffee beans 1kg", "Laptop stand",
         "Monitor 27 inch", "Network switch", "Shipping boxes", "Label roll",
         "Training session", "Hosting (monthly)", "Design revision", "Spare parts kit",
         "Safety gloves", "Whiteboard markers", "Cable ties", "Filing cabinet")
ITEM_QUALIFIERS = ("premium", "standard", "black", "large", "set of 4", "annual", "blue",
                   "refill", "express", "")
NOTES = ("Payment is due within {n} days of the invoice date.",
         "Please quote the invoice number with your payment.",
         "Goods remain our property until paid in full.",
         "Late payments may incur interest at {n}% per month.",
         "Thank you for your business.",
         "Questions about this document? Contact {email}.",
         "All prices include packaging unless stated otherwise.",
         "Returns are accepted within {n} days with the original receipt.",
         "Bank transfer to IBAN {iban}, BIC {bic}.",
         "Our terms and conditions apply to every order.",
         "Delivery was made on {date} to the address above.",
         "Offer valid until {date}.")

_DATE_STYLES = ("iso", "dmy_slash", "mdy_slash", "dmy_dot", "d_month_y", "month_d_y",
                "d_mon_y", "mon_d_y")
AMOUNT_STYLES: tuple[tuple[str, str, str, str], ...] = (
    # (prefix, thousands separator, decimal separator, suffix)
    ("$", ",", ".", ""), ("", ",", ".", ""), ("USD ", ",", ".", ""), ("", ".", ",", " €"),
    ("€", ".", ",", ""), ("£", ",", ".", ""), ("CHF ", "'", ".", ""), ("", ",", ".", " EUR"),
    ("", "", ".", ""),
)


def pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    """One of ``options``, uniformly."""
    return options[int(rng.integers(len(options)))]


def format_date(day: dt.date, style: str) -> str:
    """``day`` printed in one of the generator's date styles (English month names, whatever
    the locale)."""
    month = MONTHS[day.month - 1]
    return {
        "iso": f"{day:%Y-%m-%d}", "dmy_slash": f"{day:%d/%m/%Y}",
        "mdy_slash": f"{day:%m/%d/%Y}", "dmy_dot": f"{day:%d.%m.%Y}",
        "d_month_y": f"{day.day} {month} {day.year}",
        "month_d_y": f"{month} {day.day}, {day.year}",
        "d_mon_y": f"{day.day:02d} {month[:3]} {day.year}",
        "mon_d_y": f"{month[:3]} {day.day}, {day.year}",
    }[style]


def parse_date(text: str, *, day_first: bool = True) -> dt.date:
    """Read a date in any of :func:`format_date`'s styles (an ambiguous slash date such as
    ``03/04/2022`` is read day first unless ``day_first`` is False).

    Raises:
        ValueError: when ``text`` is none of them.
    """
    text = text.strip()
    numeric = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})|(\d{2})([/.])(\d{2})\5(\d{4})", text)
    if numeric:
        if numeric.group(1):
            return dt.date(int(numeric.group(1)), int(numeric.group(2)), int(numeric.group(3)))
        a, b, year = int(numeric.group(4)), int(numeric.group(6)), int(numeric.group(7))
        if not day_first:
            a, b = b, a
        try:
            return dt.date(year, b, a)
        except ValueError:
            return dt.date(year, a, b)
    months = {m.lower(): k + 1 for k, m in enumerate(MONTHS)}
    months.update({m[:3].lower(): k + 1 for k, m in enumerate(MONTHS)})
    named = re.fullmatch(r"(\d{1,2}) ([A-Za-z]+) (\d{4})|([A-Za-z]+) (\d{1,2}), (\d{4})", text)
    if named:
        d, month, y = ((named.group(1), named.group(2), named.group(3)) if named.group(1)
                       else (named.group(5), named.group(4), named.group(6)))
        if month.lower() in months:
            return dt.date(int(y), months[month.lower()], int(d))
    raise ValueError(f"{text!r} is not a date in a known format")


def format_amount(cents: int, style: tuple[str, str, str, str]) -> str:
    """``cents`` printed in an :data:`AMOUNT_STYLES` style, e.g. ``$1,234.56``."""
    prefix, thousands, decimal, suffix = style
    whole, frac = divmod(cents, 100)
    digits = f"{whole:,}".replace(",", thousands)
    return f"{prefix}{digits}{decimal}{frac:02d}{suffix}"


def parse_amount(text: str) -> Decimal:
    """Read an amount in any :data:`AMOUNT_STYLES` style back (two decimals always).

    Raises:
        ValueError: when ``text`` is not such an amount.
    """
    core = re.sub(r"^(USD|CHF|EUR|[$€£])\s?|\s?(USD|CHF|EUR|[$€£])$", "", text.strip())
    match = re.fullmatch(r"(\d{1,3}(?:([,.' ])\d{3})*|\d+)([.,])(\d{2})", core)
    if not match or match.group(2) == match.group(3):
        raise ValueError(f"{text!r} is not an amount in a known format")
    whole = re.sub(r"[,.' ]", "", match.group(1))
    return Decimal(f"{whole}.{match.group(4)}")


def random_date(rng: np.random.Generator) -> dt.date:
    """A day between 2015 and 2026."""
    return dt.date(2015, 1, 1) + dt.timedelta(days=int(rng.integers(0, 12 * 365)))


def date_style(rng: np.random.Generator) -> str:
    """One of the date styles, uniformly."""
    return pick(rng, _DATE_STYLES)


def amount_style(rng: np.random.Generator) -> tuple[str, str, str, str]:
    """One of :data:`AMOUNT_STYLES`, uniformly."""
    return AMOUNT_STYLES[int(rng.integers(len(AMOUNT_STYLES)))]


def company(rng: np.random.Generator) -> str:
    """A made-up company name, e.g. ``Kestrel Print Works Ltd``."""
    return " ".join(w for w in (pick(rng, VENDOR_HEADS), pick(rng, VENDOR_TRADES),
                                pick(rng, VENDOR_SUFFIXES)) if w)


def person(rng: np.random.Generator) -> str:
    """A made-up person's name."""
    return f"{pick(rng, FIRST_NAMES)} {pick(rng, LAST_NAMES)}"


def address(rng: np.random.Generator) -> list[str]:
    """Two or three address lines."""
    lines = [f"{int(rng.integers(1, 300))} {pick(rng, STREETS)}"]
    code = (f"{int(rng.integers(10000, 99999))}" if rng.random() < 0.6 else
            f"{pick(rng, ('LS', 'BS', 'G', 'D', 'M'))}{int(rng.integers(1, 20))} "
            f"{int(rng.integers(1, 9))}{pick(rng, ('AB', 'QT', 'XN', 'HP'))}")
    lines.append(f"{code} {pick(rng, CITIES)}")
    if rng.random() < 0.4:
        lines.append(f"Tel. +{int(rng.integers(1, 50))} {int(rng.integers(100, 999))} "
                     f"{int(rng.integers(100000, 999999))}")
    return lines


def email(rng: np.random.Generator) -> str:
    """A made-up address at an ``.example`` domain."""
    return f"{pick(rng, ('accounts', 'billing', 'info', 'sales'))}@" \
           f"{pick(rng, VENDOR_HEADS).lower()}.example"


def doc_number(rng: np.random.Generator) -> str:
    """A document number as one word, e.g. ``INV-20931`` or ``2024/0153``."""
    n = int(rng.integers(100, 999999))
    return pick(rng, (f"INV-{n:05d}", f"{int(rng.integers(2015, 2027))}/{n % 10000:04d}",
                      f"A-{n % 10000}-{pick(rng, ('B', 'C', 'X'))}", f"#{n}", f"{n:06d}",
                      f"R{n:07d}"))


def item_name(rng: np.random.Generator) -> str:
    """An item line's description, two to six words."""
    qualifier = pick(rng, ITEM_QUALIFIERS)
    return f"{pick(rng, ITEMS)}{', ' + qualifier if qualifier else ''}"


def note(rng: np.random.Generator, when: str) -> str:
    """One sentence of small print (``when`` is a date printed in the document's style)."""
    return pick(rng, NOTES).format(
        n=int(rng.integers(7, 61)), email=email(rng), date=when,
        iban=f"GB{int(rng.integers(10, 99))}NWBK{int(rng.integers(10**9, 10**10))}",
        bic=f"{pick(rng, VENDOR_HEADS)[:4].upper()}GB2L")
