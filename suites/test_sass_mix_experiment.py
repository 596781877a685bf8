"""ci/experiments/sass_mix: the tile loop found in SASS and its instructions counted, on a made-up listing and on the
committed kernel built for sm_90 (NVRTC and nvdisasm from the test extra; no GPU)."""

import pytest

from ci.experiments.sass_mix import sass_mix
from harness.kernels import fused_mla_cuda

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0020*/              @!P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0030*/                   F2FP.F16.E4M3.UNPACK_B R2, R3 ;
        /*0040*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0050*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0060*/                   BRA `(.L_x_3) ;
.L_x_3:
        /*0070*/               @P1 BRA `(.L_x_2) ;
        /*0080*/                   EXIT ;
"""


def test_the_loop_with_the_most_mma_is_counted():
    body = sass_mix.tile_loop(LISTING)
    assert [sass_mix.opcode(i) for i in body] == ["F2FP", "HMMA", "HMMA", "BRA", "BRA"]


def test_a_listing_without_a_loop_of_mma_is_refused():
    """Planted fault: the loop of one HMMA removed, the other's branch made forward: nothing is counted."""
    listing = LISTING.replace("@!P0 BRA `(.L_x_1)", "NOP").replace("@P1 BRA `(.L_x_2)", "@P1 BRA `(.L_x_3)")
    with pytest.raises(SystemExit, match="no loop holds an HMMA"):
        sass_mix.tile_loop(listing)


@pytest.mark.parametrize("instance", ["8,3,8", "16,2,16,pp"])
def test_the_committed_kernels_tile_loop(instance):
    """Phase A's k-steps a warp and n-tile (8 / KQ latent blocks of 4, and the RoPE share's 64 / KQ / 16) and phase
    C's (KS token steps x 4): every HMMA of the loop, and nothing spilled."""
    inst = sass_mix.parse_instance(instance)
    warps = inst.warps // (2 if inst.pp else 1)  # a ping-pong group's
    kq, ks = warps // 4, 4 // (warps // 8)
    expected = (inst.nh // 8) * ((8 // kq) * 4 + 64 // kq // 16 + ks * 4)
    mix = sass_mix.loop_mix(fused_mla_cuda.SOURCE.read_text(), inst, "90")
    assert mix.opcodes["HMMA"] == expected and mix.spill_bytes == 0, mix


def test_a_build_without_tile_math_is_refused():
    """Planted fault: DIAG_STREAM_ONLY drops phases A-C from the loop, so no loop holds an HMMA."""
    source = "#define DIAG_STREAM_ONLY 1\n" + fused_mla_cuda.SOURCE.read_text()
    with pytest.raises(SystemExit, match="no loop holds an HMMA"):
        sass_mix.loop_mix(source, sass_mix.parse_instance("8,3,8"), "90")


def test_a_json_path_already_there_is_refused(tmp_path):
    out = tmp_path / "mix.json"
    out.write_text("kept")
    with pytest.raises(SystemExit, match="exists"):
        sass_mix.main(["--json", str(out)])
    assert out.read_text() == "kept"
