"""The fix for each verdict and each platform finding, and their labels, as the fleet report shows them.

Taken from the records of exporter/vocabulary.py (the field playbook's typical fixes and checklists, in
English, shortest first), so a report never shows a cause or finding without its fix.
"""

from __future__ import annotations

from exporter.vocabulary import FINDING_LIST, VERDICT_LIST

# What each waiting cause is, in a few words (for prose: "62% of the waiting was on input preprocessing").
CAUSE_LABELS = {v.name: v.label for v in VERDICT_LIST if v.waiting}
FIXES = {v.name: v.fix for v in VERDICT_LIST}
FINDING_FIXES = {f.name: f.fix for f in FINDING_LIST}
FINDING_LABELS = {f.name: f.label for f in FINDING_LIST}


def fix_for(cause: str | None) -> str:
    """The playbook's fix for a verdict or waiting cause ("" for None or an unknown name)."""
    return FIXES.get(cause or "", "")


def finding_fix(check: str) -> str:
    """The playbook's fix for a finding ("" for a check this version does not know)."""
    return FINDING_FIXES.get(check, "")
