"""Claim 4 (sgl-project/sglang#27402): freeing out-of-window SWA at unfinished inserts bounds SWA
during long chunked prefills.

Scenario (``scenarios.long_prompt_rows``): one prompt of 1024 or 4096 tokens, chunk 256, W=32,
ps=16, SWA pool 8192. Measured peak SWA used (capacity - available):
decode_and_unfinished_insert 352 / 928, decode_only 1040 / 4112 (1024 / 4096 tokens).
What the real code bounds is the *live* SWA of the chunks: with the fix each chunk boundary keeps
one window + one page (48 slots) of evictable SWA, so the peak is chunk + chunks * (W + ps)
(~0.2 x the prompt) instead of the whole prompt; protected + held stays chunk + W = 288 either way.
"""

from __future__ import annotations

import pytest

from tests.claims import scenarios as sc

pytestmark = pytest.mark.sglang

W, PS, CHUNK = 32, 16, 256


def test_out_of_window_release_bounds_swa_in_chunked_prefill(tmp_path):
    peak, protected_held = {}, {}
    for tokens in (1024, 4096):
        w = sc.write(tmp_path, f"w{tokens}", sc.long_prompt_rows(tokens))
        for pol in ("decode_and_unfinished_insert", "decode_only"):
            run = tmp_path / f"{pol}_{tokens}"
            s = sc.replay(w, run, sc.CHUNKED_SETS, swa_out_of_window_release=pol)
            assert s.finished == 1
            st = sc.stats(run)
            peak[pol, tokens] = s.peak_swa_used
            protected_held[pol, tokens] = int((st["protected"] + st["held"]).max())
            assert sc.identity_breaks(run).height == 0

    fix, nofix = "decode_and_unfinished_insert", "decode_only"
    for tokens in (1024, 4096):
        chunks = tokens // CHUNK
        # with the fix: at most one chunk plus one window + page per chunk boundary
        assert peak[fix, tokens] <= CHUNK + chunks * (W + PS) + PS, peak
        # without it the whole prompt stays resident in SWA
        assert peak[nofix, tokens] >= tokens, peak
        assert protected_held[fix, tokens] <= CHUNK + W and protected_held[nofix, tokens] <= CHUNK + W
    # effect size: >= 3x lower at 4096 tokens (measured 4.4x), and it grows with the prompt
    assert peak[nofix, 4096] >= 3 * peak[fix, 4096], peak
    assert peak[nofix, 4096] - peak[nofix, 1024] >= 2 * (peak[fix, 4096] - peak[fix, 1024]), peak
