//! Throughput of the engine alone, without Python (ignored by default):
//! `cargo test --release --lib copy::cpu::throughput -- --ignored --nocapture`, with
//! `COPY_BENCH=<part of a case's name>` to pick cases. Every copy moves 64 MiB; the
//! configurations of a case take turns, and each shows its best of 15.

use std::time::Instant;

use super::engine::*;
use super::tiles::Isa;
use crate::memory::AlignedBuffer;

/// Huge-page aligned memory (transparent huge pages asked for, as numpy does) filled with a
/// pattern.
struct Big(AlignedBuffer);

impl Big {
    fn new(bytes: usize) -> Big {
        let buffer = AlignedBuffer::new(bytes).expect("memory for the benchmark");
        // SAFETY: the buffer is `bytes` bytes, aligned for u32, and ours alone.
        let words =
            unsafe { std::slice::from_raw_parts_mut(buffer.as_ptr().cast::<u32>(), bytes / 4) };
        for (i, w) in words.iter_mut().enumerate() {
            *w = i as u32;
        }
        Big(buffer)
    }
}

fn best(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..repeats)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// A case: name, destination, source, item size, byte swap.
type Case = (String, Strided, Strided, usize, Option<usize>);

/// `rows` x `cols` items of `z` bytes, C order, at `dst` + `off`, from the transpose of a C-order
/// `cols` x `rows` array at `src` + `off`.
fn transpose(
    name: &str,
    rows: usize,
    cols: usize,
    z: usize,
    off: usize,
    p: (*mut u8, *mut u8),
) -> Case {
    let (r, c, z) = (rows as isize, cols as isize, z as isize);
    let dst = Strided {
        ptr: p.0.wrapping_add(off),
        shape: vec![rows, cols],
        strides: vec![c * z, z],
    };
    let src = Strided {
        ptr: p.1.wrapping_add(off),
        shape: vec![rows, cols],
        strides: vec![z, r * z],
    };
    (name.into(), dst, src, z as usize, None)
}

#[test]
#[ignore = "benchmark"]
fn throughput() {
    let n = 16 << 20; // 64 MiB of f32
    let (src, dst) = (Big::new(8 * n), Big::new(4 * n + 4096));
    let (sp, dp) = (src.0.as_ptr(), dst.0.as_ptr());
    let report = |name: &str, secs: f64| {
        let rate = 2.0 * (n * 4) as f64 / secs / 1e9;
        println!("{name:<44} {:8.2} ms {rate:6.1} GB/s", secs * 1e3);
    };
    // Every layout below addresses inside `src` (2n items) and `dst` (n items + 4 KiB).
    let memcpy = || {
        // SAFETY: `n * 4` bytes lie inside `src` (8n bytes) and `dst` (4n + 4096), two
        // buffers that live through the benchmark.
        unsafe { std::ptr::copy_nonoverlapping(sp, dp, n * 4) }
    };
    report("memcpy 64 MiB (1 thread)", best(15, memcpy));
    let c = |shape: Vec<usize>, strides: Vec<isize>, p: *mut u8| Strided {
        ptr: p,
        shape,
        strides,
    };
    let p = (dp, sp);
    let mut cases: Vec<Case> = vec![
        (
            "contiguous 64 MiB".into(),
            c(vec![n], vec![4], dp),
            c(vec![n], vec![4], sp),
            4,
            None,
        ),
        transpose("transpose 4096x4096", 4096, 4096, 4, 0, p),
        transpose("transpose 4096x4096 +64 bytes", 4096, 4096, 4, 64, p),
        // Where numpy's large arrays start: 16 bytes past a page.
        transpose("transpose 4096x4096 +16 bytes", 4096, 4096, 4, 16, p),
        transpose("transpose 4095x4097 +16 bytes", 4095, 4097, 4, 16, p),
        transpose("transpose 2048x4096 f64", 2048, 4096, 8, 0, p),
        transpose("transpose 4096x8192 u16", 4096, 8192, 2, 0, p),
        transpose("transpose 8192x8192 u8", 8192, 8192, 1, 0, p),
        transpose("transpose 2048x2048 complex128", 2048, 2048, 16, 0, p),
        (
            "permute 64^4 (3,1,2,0)".into(),
            c(vec![64; 4], vec![4 << 18, 4 << 12, 4 << 6, 4], dp),
            c(vec![64; 4], vec![4, 4 << 12, 4 << 6, 4 << 18], sp),
            4,
            None,
        ),
        (
            "gather stride 2".into(),
            c(vec![n], vec![4], dp),
            c(vec![n], vec![8], sp),
            4,
            None,
        ),
        (
            "reverse".into(),
            c(vec![n], vec![4], dp),
            c(vec![n], vec![-4], sp.wrapping_add(4 * (n - 1))),
            4,
            None,
        ),
    ];
    let mut swapped = transpose("transpose 4096x4096 byte-swapped", 4096, 4096, 4, 0, p);
    swapped.4 = Some(4);
    cases.push(swapped);
    let only = std::env::var("COPY_BENCH").unwrap_or_default();
    let n_threads = super::tune::available_threads();
    let fixed = |threads, streaming| Config::fixed(threads, streaming);
    let configs = [
        ("".to_string(), Config::new()),
        (" (1 thread)".into(), fixed(1, false)),
        (" (1 thread, streaming)".into(), fixed(1, true)),
        (format!(" ({n_threads} threads)"), fixed(n_threads, false)),
        (
            format!(" ({n_threads} threads, streaming)"),
            fixed(n_threads, true),
        ),
        (
            " (baseline ISA, streaming)".into(),
            Config {
                isa: Isa::baseline(),
                ..fixed(1, true)
            },
        ),
    ];
    for (name, d, s, item, swap) in cases.iter().filter(|c| c.0.contains(only.as_str())) {
        let mut times = [f64::INFINITY; 6];
        for _ in 0..15 {
            for (k, (_, config)) in configs.iter().enumerate() {
                // SAFETY: every case's layouts lie inside `src` (2n items) and `dst` (n items +
                // 4 KiB), two buffers that live through the loop.
                let t = best(1, || unsafe {
                    copy_strided_with(d, s, *item, *swap, *config)
                });
                times[k] = times[k].min(t);
            }
        }
        for ((label, _), t) in configs.iter().zip(times) {
            report(&format!("{name}{label}"), t);
        }
    }
    for entry in super::tune::report().entries {
        if let Some(record) = entry.record {
            println!("{:?}: {:?}", entry.key, record);
        }
    }
}

/// Per-call cost of small copies: the engine against a bare `memcpy` of the same bytes.
#[test]
#[ignore = "benchmark"]
fn small_copies() {
    for bytes in [4usize << 10, 64 << 10, 1 << 20] {
        let (src, dst) = (Big::new(bytes), Big::new(bytes));
        let (sp, dp) = (src.0.as_ptr(), dst.0.as_ptr());
        let n = bytes / 4;
        let c = |p| Strided {
            ptr: p,
            shape: vec![n],
            strides: vec![4],
        };
        let (d, s) = (c(dp), c(sp));
        let calls = (64 << 20) / bytes;
        let per_call = |f: &dyn Fn()| {
            best(7, || {
                for _ in 0..calls {
                    f();
                }
            }) / calls as f64
        };
        // SAFETY: `bytes` bytes in each of two buffers of that size.
        let memcpy = per_call(&|| unsafe { std::ptr::copy_nonoverlapping(sp, dp, bytes) });
        // SAFETY: the layouts address the two buffers exactly.
        let ours = per_call(&|| unsafe { copy_strided(&d, &s, 4, None) });
        println!(
            "{:>8} bytes: memcpy {:8.1} ns, copy_strided {:8.1} ns",
            bytes,
            memcpy * 1e9,
            ours * 1e9
        );
    }
}

/// What calibration measures on chunks of a 4096x4096 transpose against what whole copies run
/// at, each way, ten times over (a fresh tuner each time): whether the chunks judge the ways as
/// the copy would.
#[test]
#[ignore = "benchmark"]
fn calibration_against_whole_copies() {
    use super::tune::{How, Limits, Settings, Tuner};
    let n = 16 << 20;
    let (src, dst) = (Big::new(8 * n), Big::new(4 * n + 4096));
    let t = transpose("t", 4096, 4096, 4, 0, (dst.0.as_ptr(), src.0.as_ptr()));
    let threads = super::tune::available_threads();
    let ways = [(1, false), (1, true), (threads, false), (threads, true)];
    let rate = |secs_per_byte: f64| 2.0 / secs_per_byte / 1e9;
    for _ in 0..10 {
        let tuner = Tuner::new(Limits::DEFAULT, Settings::default(), threads);
        let tuner: &'static Tuner = super::tests::keep(tuner);
        let config = Config {
            tuner,
            ..Config::new()
        };
        // SAFETY: the layouts lie inside the two buffers, which live through the test.
        unsafe { copy_strided_with(&t.1, &t.2, 4, None, config) };
        for (_, record) in tuner.log() {
            if let How::Measured(m) = record.how {
                for (c, s) in m.candidates {
                    let way = if c.streaming { "streaming" } else { "regular" };
                    print!("{}t {way} {:.1}  ", c.threads, s.map_or(0.0, rate));
                }
            }
        }
        print!("| whole copies:");
        for (threads, streaming) in ways {
            let config = Config::fixed(threads, streaming);
            // SAFETY: the layouts lie inside the two buffers, which live through the test.
            let secs = best(3, || unsafe {
                copy_strided_with(&t.1, &t.2, 4, None, config)
            });
            print!(" {:.1}", rate(secs / (n * 4) as f64));
        }
        println!(" GB/s");
    }
}
