"""Every counter key the code writes to the fleet's counters hash has a named metric.

The keys are found in the source (``counters.incr("...")``, decision notes, tenant and
visibility reasons), so a new counter without an entry in
``celery_aitp/dashboard/event_counters.py`` fails here instead of landing in
``aitp_other_events_total``.
"""

from __future__ import annotations

import re
from pathlib import Path

from celery_aitp.dashboard.event_counters import EVENT_COUNTERS, OTHER_EVENTS, classify

PACKAGE = Path(__file__).resolve().parents[2] / "celery_aitp"
PATTERNS = [
    re.compile(r'\.incr\(\s*f?"([^"]+)"'),  # counters.incr("key") and f"prefix:{name}"
    re.compile(r'add_counts\(\{\s*"([^"]+)"'),
    re.compile(r'notes\.append\("([^"]+)"\)'),  # decision notes are counted as keys
    re.compile(r'_label_impact\([^)]*"([a-z_]+)"\)'),  # the note a bad label list gets
    re.compile(r'return self\.default, "([a-z_]+)"'),  # tenant resolution notes
    re.compile(r'^REASON_[A-Z]+ = "([a-z_]+)"', re.M),  # visibility notes
]


def counter_keys() -> dict[str, str]:
    """key (an f-string's fields replaced by 'x') -> the file that writes it."""
    found: dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        if "dashboard" in path.parts:
            continue
        text = path.read_text("utf-8")
        for pattern in PATTERNS:
            for key in pattern.findall(text):
                found[re.sub(r"\{[^}]*\}", "x", key)] = str(path.relative_to(PACKAGE))
    return found


def test_the_scan_finds_the_known_counters():
    keys = counter_keys()
    assert {"tenant_unknown", "tenant_refused", "visibility_eta", "rejected:headers",
            "records_dropped:x", "evacuated", "aged", "labels_invalid",
            "rejected:aitp_header:x", "reserve:x"} <= set(keys)
    assert len(keys) >= 25


def test_every_counter_the_code_writes_has_a_named_family():
    unnamed = {key: where for key, where in counter_keys().items()
               if classify(key) is None or classify(key)[0] == OTHER_EVENTS}
    assert not unnamed, (f"counters without a metric: {unnamed}; add each to "
                         "celery_aitp/dashboard/event_counters.py")


def test_families_follow_the_naming_conventions():
    for name, family in EVENT_COUNTERS.items():
        assert re.fullmatch(r"aitp_[a-z_]+_total", name), name
        assert family.help.endswith("."), name
        assert bool(family.label) == bool(family.prefix or len(family.keys) > 1
                                          or name == OTHER_EVENTS), name
    exact = [key for family in EVENT_COUNTERS.values() for key in family.keys]
    assert len(exact) == len(set(exact))  # each key feeds one family

