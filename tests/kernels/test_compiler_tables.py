"""reference.bench.compiler_tables: the compiler's numbers laid out within the book's column."""
from reference.bench.compiler_tables import block_h_glue, build, format_builds, format_ptx

ROWS = [{"config": "fp16 D=128 full   128x128 w8 s3", "target": gpu, "compiles": True,
         "shared_kib": kib, "limit_kib": limit, "registers": 255, "spilled_bytes": spill,
         "fits": kib <= limit}
        for gpu, kib, limit, spill in (("T4", 128, 64, 61912), ("A100", 160, 163, 56),
                                       ("H100", 224, 227, 0))]


def test_every_build_is_one_line_within_the_column():
    lines = format_builds(ROWS, drop="fp16 D=128 full").splitlines()
    assert len(lines) == 2 + len(ROWS)
    assert max(map(len, lines)) <= 80, "the book's code column holds 80 characters"
    assert lines[2].split() == ["128x128", "w8", "s3", "T4", "128", "64", "255", "61912", "NO"]


def test_a_build_that_failed_shows_dashes_not_numbers():
    failed = dict(ROWS[0], compiles=False, fits=False)
    assert format_builds([failed]).splitlines()[2].split()[-5:] == ["-", "64", "-", "-", "NO"]


def test_build_picks_the_row_by_words_and_gpu():
    assert build(ROWS, "128x128", "A100")["shared_kib"] == 160


def test_ptx_lines_are_counted_and_cut_to_the_column():
    ptx = {"config": "fp32 N=2000", "target": "A100", "lines": 562,
           "picked": {"ld.global": ["@%p1 ld.global.v4.b32 { %r1 }, [ %rd1 + 0 ];"],
                      "ex2": ["ex2.approx.ftz.f32 \t%r112, %r96;" + " " * 90 + "x"]}}
    text = format_ptx(ptx).splitlines()
    assert text[0] == "fp32 N=2000 for A100: 562 lines of PTX"
    assert text[3].split() == ["ex2", "1", "lines"]
    assert "\t" not in text[4] and len(text[4]) <= 80


def test_a_split_kernels_numbers_are_named_by_block_h_and_gpu():
    rows = [dict(row, config=f"fp16 D=128 BLOCK_H={h}", spilled_bytes=spill * (h == 64))
            for h in (16, 64) for row, spill in zip(ROWS, (13360, 0, 0))]
    numbers = block_h_glue(rows, "split")
    assert numbers["split_64_A100_kib"] == 160 and numbers["split_16_H100_regs"] == 255
    assert numbers["split_t4_64_phrase"] == "spills 13,360 bytes per thread"
    assert len(numbers) == 2 * 3 * 2 + 1
