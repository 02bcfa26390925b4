//! The tile kernels against an element-by-element reference, on buffers placed at every
//! offset from a cache line, so that line heads, block edges, tile ends and the streaming
//! kernels' alignment are all reached.

use proptest::prelude::*;

use super::*;
use crate::copy::cpu::elem::{Dyn, Swapped};

/// A buffer with a 64-byte aligned point inside it, and room before and after it.
struct Buf {
    bytes: Vec<u8>,
    aligned: usize,
}

impl Buf {
    fn new(len: usize, seed: u8) -> Self {
        let bytes: Vec<u8> = (0..len + 3 * LINE)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect();
        let aligned = (bytes.as_ptr() as usize).wrapping_neg() % LINE + LINE;
        Buf { bytes, aligned }
    }
}

/// Items `i` (along `a`) x `j` (along `b`) at each step of `m`, byte strides on both sides.
#[derive(Clone, Debug)]
struct Layout {
    z: usize,
    /// Byte-swap unit; 0 for none.
    unit: usize,
    m: Dim,
    a: Dim,
    b: Dim,
    /// Offsets of element (0, 0) from a line boundary.
    dst_off: usize,
    src_off: usize,
    streaming: bool,
    avx512: bool,
}

impl Layout {
    /// Bytes one side spans, and element (0, 0, 0)'s offset from the lowest address.
    fn span(&self, stride: impl Fn(&Dim) -> isize) -> (usize, usize) {
        let reach = [self.m, self.a, self.b].map(|d| (d.n as isize - 1) * stride(&d));
        let low: isize = reach.iter().map(|r| r.min(&0)).sum();
        let high: isize = reach.iter().map(|r| r.max(&0)).sum();
        ((high - low) as usize + self.z, (-low) as usize)
    }
}

/// The reference: element by element, each unit's bytes reversed when swapping.
fn reference(l: &Layout, dst: &mut [u8], d0: usize, src: &[u8], s0: usize) {
    let steps = |d: Dim| (0..d.n as isize).map(move |i| (i * d.dst, i * d.src));
    for (dm, sm) in steps(l.m) {
        for (da, sa) in steps(l.a) {
            for (db, sb) in steps(l.b) {
                let d = (d0 as isize + dm + da + db) as usize;
                let s = (s0 as isize + sm + sa + sb) as usize;
                for byte in 0..l.z {
                    let from = if l.unit > 1 {
                        byte / l.unit * l.unit + l.unit - 1 - byte % l.unit
                    } else {
                        byte
                    };
                    dst[d + byte] = src[s + from];
                }
            }
        }
    }
}

fn check(l: &Layout) -> Result<(), TestCaseError> {
    let (dst_len, dst_base) = l.span(|d| d.dst);
    let (src_len, src_base) = l.span(|d| d.src);
    let src = Buf::new(src_len + LINE, 3);
    let mut actual = Buf::new(dst_len + LINE, 101);
    let s0 = src.aligned + l.src_off + src_base;
    let d0 = actual.aligned + l.dst_off + dst_base;
    let mut expected = actual.bytes.clone();
    reference(l, &mut expected, d0, &src.bytes, s0);
    let isa = Isa {
        #[cfg(target_arch = "x86_64")]
        avx512: if l.avx512 { Avx512::detect() } else { None },
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = l.avx512; // one set of block kernels elsewhere
    let options = Options {
        streaming: l.streaming,
        isa,
    };
    let (d, s) = (
        actual.bytes.as_mut_ptr().wrapping_add(d0),
        src.bytes.as_ptr().wrapping_add(s0),
    );
    macro_rules! go {
        ($e:expr) => {
            // SAFETY: both layouts lie inside their buffers by construction.
            unsafe {
                tiles(
                    $e,
                    d,
                    s,
                    Loops {
                        m: l.m,
                        a: l.a,
                        b: l.b,
                    },
                    options,
                )
            }
        };
    }
    match (l.z, l.unit) {
        (1, _) => go!(Plain::<u8>::new()),
        (2, 0) => go!(Plain::<u16>::new()),
        (4, 0) => go!(Plain::<u32>::new()),
        (8, 0) => go!(Plain::<u64>::new()),
        (16, 0) => go!(Plain::<u128>::new()),
        (4, 4) => go!(Swapped::<u32, u32>::new()),
        (8, 4) => go!(Swapped::<u64, u32>::new()),
        (z, unit) => go!(Dyn { size: z, unit }),
    }
    prop_assert!(actual.bytes == expected, "{:?}", l);
    Ok(())
}

/// A stride past `bytes`: no gap, a few bytes (possibly between items), or up to the next line.
fn padded(bytes: usize, z: usize) -> impl Strategy<Value = isize> {
    prop_oneof![
        3 => Just(bytes as isize),
        1 => (1..3 * z + 5).prop_map(move |g| (bytes + g) as isize),
        2 => Just((bytes.div_ceil(LINE) * LINE) as isize),
    ]
}

/// Layouts the tiles get from the planner: `a` walks the source densely (mostly unit stride)
/// and `b` the destination (mostly unit stride), each striding far along the other's loop;
/// `m`, where there is one, mostly carries on along the source from where `a` ends, and in the
/// destination lies outside `a` or between `a` and `b` (as in a permute).
fn layout() -> impl Strategy<Value = Layout> {
    let z = proptest::sample::select(vec![1usize, 2, 4, 8, 16, 3, 6, 12]);
    let m_n = prop_oneof![3 => Just(1usize), 1 => 2usize..5];
    (z, any::<bool>(), m_n).prop_flat_map(|(z, swap, m_n)| {
        let side = block_side(z);
        let run = RUN_BYTES / z;
        // Up to a few blocks, or (for one step of `m`) around the end of the first tile.
        let few = 1..4 * side + 3;
        let a_n = if m_n > 1 {
            few.boxed()
        } else {
            prop_oneof![few, run.saturating_sub(2 * side).max(1)..run + 2 * side].boxed()
        };
        let b_n = 1..4 * side + 3;
        let unit = match (z, swap) {
            (_, false) | (1, true) => Just(0).boxed(),
            (8, true) => prop_oneof![Just(8), Just(4)].boxed(),
            (_, true) => Just(z).boxed(),
        };
        let step = || prop_oneof![6 => Just(1usize), 1 => Just(2usize)];
        (a_n, b_n, unit, step(), step()).prop_flat_map(move |(a_n, b_n, unit, ua, ub)| {
            let (a_src, b_dst) = ((ua * z) as isize, (ub * z) as isize);
            let row = || padded(b_n * ub * z, z); // the destination's rows along `b`
            (
                (row(), any::<bool>(), row()).prop_flat_map(move |(row, m_inside, row2)| {
                    // (m.dst, a.dst): `m` between `a` and `b`, or outside `a`.
                    if m_inside {
                        padded(m_n * row as usize, z)
                            .prop_map(move |a| (row, a))
                            .boxed()
                    } else {
                        padded(a_n * row2 as usize, z)
                            .prop_map(move |m| (m, row2))
                            .boxed()
                    }
                }),
                // m.src: on from the end of `a`, or anywhere past it.
                prop_oneof![3 => Just(a_n as isize * a_src), 1 => padded(a_n * ua * z, z)],
                proptest::bool::weighted(0.2),
                (0usize..LINE, 0usize..LINE),
                prop_oneof![Just(0usize), Just(16), 0usize..LINE],
                (any::<bool>(), any::<bool>()),
            )
                .prop_flat_map(
                    move |((m_dst, a_dst), m_src, flip, offs, off2, flags)| {
                        padded(m_n * m_src as usize, z).prop_map(move |b_src| Layout {
                            z,
                            unit,
                            m: Dim {
                                n: m_n,
                                dst: m_dst,
                                src: m_src,
                            },
                            a: Dim {
                                n: a_n,
                                dst: a_dst,
                                src: a_src,
                            },
                            b: Dim {
                                n: b_n,
                                dst: b_dst,
                                // Source rows walked backwards too.
                                src: if flip { -b_src } else { b_src },
                            },
                            // Mostly the alignments arrays have: a line, or 16 bytes past one.
                            dst_off: if offs.0 < 48 { off2 } else { offs.0 },
                            src_off: offs.1,
                            streaming: flags.0,
                            avx512: flags.1,
                        })
                    },
                )
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn tiles_match_reference(l in layout()) {
        check(&l)?;
    }
}

/// Steps of `m` that move the destination rows off the streaming stores' alignment: the blocks
/// must fall back to ordinary stores (a misaligned streaming store faults).
#[test]
fn steps_of_m_off_the_line() {
    // One band of `b` (a line) per step of `m`, the steps inside the rows of `a`.
    for (z, m_dst) in [(4, 80), (4, 96), (4, 68), (8, 80), (8, 96), (8, 72)] {
        let side = block_side(z);
        let (zi, n) = (z as isize, 2 * side);
        let m = Dim {
            n: 3,
            dst: m_dst,
            src: n as isize * zi,
        };
        let a = Dim {
            n,
            dst: 5 * LINE as isize,
            src: zi,
        };
        let b = Dim {
            n: side,
            dst: zi,
            src: 3 * n as isize * zi,
        };
        for avx512 in [false, true] {
            let l = Layout {
                z,
                unit: 0,
                m,
                a,
                b,
                dst_off: 0,
                src_off: 0,
                streaming: true,
                avx512,
            };
            check(&l).unwrap();
        }
    }
}

#[test]
fn heads_align_every_block_row() {
    let a = |dst| Dim {
        n: 1000,
        dst,
        src: 4,
    };
    let b = |src| Dim {
        n: 100,
        dst: 4,
        src,
    };
    let at = |addr: usize| addr as *mut u8;
    // Rows a multiple of a line apart: the heads reach the next line on both sides.
    let one = Dim {
        n: 1,
        dst: 0,
        src: 0,
    };
    let loops = |a, b| Loops { m: one, a, b };
    let h = Heads::new(
        at(4096 + 16),
        at(8192 + 20),
        loops(a(1024), b(2048)),
        4,
        true,
    );
    assert_eq!((h.ha, h.hb, h.dst_align), (11, 12, 64));
    // Rows 16 bytes off a line: no head, and streaming stores of 16 bytes at most.
    let h = Heads::new(at(4096), at(8192), loops(a(1040), b(2048)), 4, true);
    assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 16));
    // The steps of `m` count too, where there are several.
    let m = Dim {
        n: 2,
        dst: 32,
        src: 400,
    };
    let with_m = Loops {
        m,
        ..loops(a(1024), b(2048))
    };
    let h = Heads::new(at(4096), at(8192), with_m, 4, true);
    assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 32));
    let with_m = Loops {
        m,
        ..loops(a(1040), b(2048))
    };
    let h = Heads::new(at(4096), at(8192), with_m, 4, true);
    assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 16));
    // A head longer than the loop stops at its end.
    let short = loops(Dim { n: 5, ..a(1024) }, Dim { n: 3, ..b(64) });
    let h = Heads::new(at(4096 + 16), at(8192), short, 4, true);
    assert_eq!((h.ha, h.hb), (0, 3));
    // Source rows (along `a`) shorter than SRC_ALIGN_MIN_BYTES start where they start.
    let short_a = loops(Dim { n: 100, ..a(1024) }, b(2048));
    let h = Heads::new(at(4096 + 16), at(8192 + 20), short_a, 4, true);
    assert_eq!((h.ha, h.hb, h.dst_align), (0, 12, 64));
    // Unaligned: the blocks start at once, and their rows keep the alignment they have.
    let h = Heads::new(
        at(4096 + 16),
        at(8192 + 20),
        loops(a(1024), b(2048)),
        4,
        false,
    );
    assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 16));
    assert_eq!(tile_granule(4), 16);
    assert_eq!(tile_granule(3), 21);
    assert_eq!(tile_granule(64), 1);
}
