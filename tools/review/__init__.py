"""Stage 5, the reviewer's checks and the record of review rounds.

Code, not prompts: text in a brief or a model reply cannot talk a check out of its verdict.
"""

from tools.review.checks import check_plan, decide, round_findings

__all__ = ["check_plan", "decide", "round_findings"]
