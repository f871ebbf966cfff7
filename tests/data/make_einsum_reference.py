#!/usr/bin/env python3
# Writes tests/data/einsum_numpy_reference.txt: per case the equation, the
# inputs (multiples of 1/8 in [-1, 1], exact in every float dtype, and times
# 8 integers) and numpy.einsum's float64 result, for tests/cpu_einsum_test.cc.
# Run once with Debian's python3 (numpy):
#   /usr/bin/python3 tests/data/make_einsum_reference.py > tests/data/einsum_numpy_reference.txt
import numpy as np

CASES = [
    ("matmul", "ij,jk->ik", [(3, 4), (4, 5)]),
    ("attention_scores", "bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("attention_values", "bhqk,bhkd->bhqd", [(2, 3, 4, 6), (2, 3, 6, 5)]),
    ("outer", "i,j->ij", [(3,), (4,)]),
    ("trace", "ii->", [(4, 4)]),
    ("diagonal", "ii->i", [(4, 4)]),
    ("transpose", "ij->ji", [(3, 4)]),
    ("sum_all", "ij->", [(3, 4)]),
    ("sum_and_permute", "ijk->ki", [(2, 3, 4)]),
    ("ellipsis_broadcast", "...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("implicit", "ij,jk", [(3, 4), (4, 5)]),
    ("implicit_ellipsis", "...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("implicit_upper_first", "bA,Ac", [(2, 3), (3, 4)]),
    ("three_operands", "ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("bilinear", "bn,anm,bm->ba", [(3, 4), (2, 4, 5), (3, 5)]),
    ("batch_diagonal", "...ii->...i", [(2, 3, 3)]),
    ("inner_product", "ij,ij->", [(3, 4), (3, 4)]),
    ("spaces", "bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),
    ("diagonal_then_contract", "iij,jk->ik", [(3, 3, 4), (4, 2)]),
    ("size_one_broadcast", "ij,ij->ij", [(3, 1), (1, 4)]),
    ("scalar_operand", ",ij->ji", [(), (2, 3)]),
    ("four_operands", "a,b,c,d->abcd", [(2,), (3,), (2,), (3,)]),
    ("batch_kept_and_summed", "bik,bkj->bj", [(2, 3, 4), (2, 4, 5)]),
    ("left_transposed", "ki,kj->ij", [(4, 3), (4, 5)]),
    ("empty_sum", "ij,jk->ik", [(2, 0), (0, 3)]),
]

rng = np.random.RandomState(20261206)
for name, equation, shapes in CASES:
    inputs = [rng.randint(-8, 9, size=s).astype(np.float64) / 8 for s in shapes]
    out = np.einsum(equation, *inputs)
    print("case", name, equation.replace(" ", "_"))
    for x in inputs:
        print("in", *x.shape)
        print(*[repr(float(v)) for v in x.ravel()])
    print("out", *np.shape(out))
    print(*[repr(float(v)) for v in np.ravel(out)])
