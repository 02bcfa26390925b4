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

/// Items `i` (along `a`) x `j` (along `b`): `a.n` x `b.n`, byte strides on both sides.
#[derive(Clone, Debug)]
struct Layout {
    z: usize,
    /// Byte-swap unit; 0 for none.
    unit: usize,
    a: Dim,
    b: Dim,
    /// Offsets of element (0, 0) from a line boundary.
    dst_off: usize,
    src_off: usize,
    streaming: bool,
    avx512: bool,
}

impl Layout {
    /// Bytes each side spans, and element (0, 0)'s offset from the lowest address.
    fn span(n: (usize, usize), strides: (isize, isize), z: usize) -> (usize, usize) {
        let reach = |n: usize, s: isize| (n as isize - 1) * s;
        let (ra, rb) = (reach(n.0, strides.0), reach(n.1, strides.1));
        let low = ra.min(0) + rb.min(0);
        let high = ra.max(0) + rb.max(0);
        ((high - low) as usize + z, (-low) as usize)
    }
}

/// The reference: element by element, each unit's bytes reversed when swapping.
fn reference(l: &Layout, dst: &mut [u8], d0: usize, src: &[u8], s0: usize) {
    for i in 0..l.a.n as isize {
        for j in 0..l.b.n as isize {
            let d = (d0 as isize + i * l.a.dst + j * l.b.dst) as usize;
            let s = (s0 as isize + i * l.a.src + j * l.b.src) as usize;
            for k in 0..l.z {
                let from = if l.unit > 1 {
                    k / l.unit * l.unit + l.unit - 1 - k % l.unit
                } else {
                    k
                };
                dst[d + k] = src[s + from];
            }
        }
    }
}

fn check(l: &Layout) -> Result<(), TestCaseError> {
    let (dst_len, dst_base) = Layout::span((l.a.n, l.b.n), (l.a.dst, l.b.dst), l.z);
    let (src_len, src_base) = Layout::span((l.a.n, l.b.n), (l.a.src, l.b.src), l.z);
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
            unsafe { tiles($e, d, s, l.a, l.b, options) }
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

/// A stride of `n` items of `z` bytes plus a gap: none, a few bytes, or up to the next line.
fn padded(n: usize, z: usize) -> impl Strategy<Value = isize> {
    let dense = (n * z) as isize;
    prop_oneof![
        3 => Just(dense),
        1 => (1isize..(3 * z as isize + 5)).prop_map(move |g| dense + g),
        2 => Just(((n * z).div_ceil(LINE) * LINE) as isize),
    ]
}

/// Layouts the tiles get from the planner: `a` walks the source densely (mostly unit stride)
/// and `b` the destination (mostly unit stride), each striding far along the other's loop.
fn layout() -> impl Strategy<Value = Layout> {
    let z = proptest::sample::select(vec![1usize, 2, 4, 8, 16, 3, 6, 12]);
    (z, any::<bool>()).prop_flat_map(|(z, swap)| {
        let side = block_side(z);
        let run = RUN_BYTES / z;
        // Up to a few blocks, or around the end of the first tile.
        let a_n = prop_oneof![
            1..4 * side + 3,
            run.saturating_sub(2 * side).max(1)..run + 2 * side
        ];
        let b_n = 1..4 * side + 3;
        let unit = match (z, swap) {
            (_, false) | (1, true) => Just(0).boxed(),
            (8, true) => prop_oneof![Just(8), Just(4)].boxed(),
            (_, true) => Just(z).boxed(),
        };
        let unit_a = prop_oneof![6 => Just(1isize), 1 => Just(2isize)];
        let unit_b = prop_oneof![6 => Just(1isize), 1 => Just(2isize)];
        (a_n, b_n, unit, unit_a, unit_b).prop_flat_map(move |(a_n, b_n, unit, ua, ub)| {
            let z = z as isize;
            (
                padded(b_n * ub as usize, z as usize),
                padded(a_n * ua as usize, z as usize),
                proptest::bool::weighted(0.2),
                0usize..LINE,
                0usize..LINE,
                prop_oneof![Just(0usize), Just(16), 0usize..LINE],
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(
                    move |(a_dst, b_src, flip, dst_off, src_off, dst_off2, streaming, avx512)| {
                        Layout {
                            z: z as usize,
                            unit,
                            a: Dim {
                                n: a_n,
                                dst: a_dst,
                                src: ua * z,
                            },
                            b: Dim {
                                n: b_n,
                                dst: ub * z,
                                // Source rows walked backwards too.
                                src: if flip { -b_src } else { b_src },
                            },
                            // Mostly the alignments arrays have: a line, or 16 bytes past one.
                            dst_off: if dst_off < 48 { dst_off2 } else { dst_off },
                            src_off,
                            streaming,
                            avx512,
                        }
                    },
                )
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]
    #[test]
    fn tiles_match_reference(l in layout()) {
        check(&l)?;
    }
}

#[test]
fn heads_align_every_block_row() {
    let a = |dst| Dim {
        n: 100,
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
    let h = Heads::new(at(4096 + 16), at(8192 + 20), a(1024), b(2048), 4);
    assert_eq!((h.ha, h.hb, h.dst_align), (11, 12, 64));
    // Rows 16 bytes off a line: no head, and streaming stores of 16 bytes at most.
    let h = Heads::new(at(4096), at(8192), a(1040), b(2048), 4);
    assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 16));
    // A head longer than the loop stops at its end.
    let h = Heads::new(
        at(4096 + 16),
        at(8192),
        Dim { n: 5, ..a(1024) },
        Dim { n: 3, ..b(64) },
        4,
    );
    assert_eq!((h.ha, h.hb), (0, 3));
    assert_eq!(tile_granule(4), 16);
    assert_eq!(tile_granule(3), 21);
    assert_eq!(tile_granule(64), 1);
}
