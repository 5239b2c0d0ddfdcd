"""The code process's stubs and kernel fallbacks, without the fork (pure Python / torch)."""

from __future__ import annotations

import subprocess
import sys


def test_a_stubbed_triton_kernel_launch_raises_naming_the_kernel():
    code = ("from replay.codes.stubs import install_stubs, StubKernelLaunched\n"
            "install_stubs()\n"
            "import triton, triton.language as tl, sgl_kernel.kvcacheio\n"
            "@triton.jit\n"
            "def my_kernel(x, BLOCK: tl.constexpr):\n    pass\n"
            "try:\n    my_kernel[(1,)](0, BLOCK=4)\nexcept StubKernelLaunched as e:\n    print('raised', e)\n"
            "try:\n    sgl_kernel.kvcacheio.transfer_kv_all_layer(1)\nexcept StubKernelLaunched:\n    print('sgl raised')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "raised Triton kernel __main__.my_kernel" in out.stdout and "sgl raised" in out.stdout


def _decode_reference(seq_lens, last_loc, free_pages, page_size):
    out, k = [], 0
    for s, last in zip(seq_lens, last_loc):
        if (s - 1) % page_size == 0:
            out.append(free_pages[k] * page_size)
            k += 1
        else:
            out.append(last + 1)
    return out


def test_alloc_decode_torch_matches_the_kernels_contract():
    import torch

    from replay.codes.kernels import alloc_decode_torch

    page = 4
    seq_lens = [1, 5, 6, 9, 3, 13]
    last_loc = [-1, 40, 41, 71, 10, 95]
    free = torch.tensor([7, 3, 11, 2], dtype=torch.int64)
    out = torch.empty(len(seq_lens), dtype=torch.int64)
    alloc_decode_torch(torch.tensor(seq_lens), torch.tensor(last_loc), free, out, page)
    assert out.tolist() == _decode_reference(seq_lens, last_loc, free.tolist(), page)
