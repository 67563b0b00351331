"""What a user reads: the terminal summary (``terminal``, and ``side_by_side`` for several frameworks),
the JSON report (``json_report``) and its chart (``chart``). Each renders verdicts computed once in
``pytest_rlbench.verdict``; none judges anything itself.
"""
