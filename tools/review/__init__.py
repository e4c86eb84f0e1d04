"""Stage 5, the reviewer's checks and the record of review rounds.

Code, not prompts: text in a brief or a model reply cannot talk a check out of its verdict.
"""

from tools.review.checks import check_plan, memory_comparison, memory_fix
from tools.review.config_keys import auto_paths, config_key_findings
from tools.review.contract import check_contract
from tools.review.rounds import decide, round_findings, setup_of
from tools.review.wishes import check_wishes

__all__ = [
    "auto_paths",
    "check_contract",
    "check_plan",
    "check_wishes",
    "config_key_findings",
    "decide",
    "memory_comparison",
    "memory_fix",
    "round_findings",
    "setup_of",
]
