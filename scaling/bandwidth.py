"""The bandwidth of a collective as NCCL-tests defines it, shared by what measures it
(scaling.comm_measure) and what predicts from it (scaling.model).

For an all-reduce of S bytes over n ranks in t seconds, algbw = S / t and busbw = algbw x
2(n-1)/n: the rate of the ring's slowest link, which does not depend on n, so a busbw measured
on one shape predicts another. GB = 1e9 bytes. Kept free of torch so the study's tools start fast.
"""
GB = 1e9


def algbw_from_busbw(busbw, n):
    """NCCL-tests: busbw = algbw * 2(n-1)/n for all-reduce. One rank has no bus: None."""
    return None if n < 2 else busbw * n / (2 * (n - 1))


def busbw_from_algbw(algbw, n):
    return None if n < 2 else algbw * 2 * (n - 1) / n
