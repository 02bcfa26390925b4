//! The planner: a copy between two views sent as transfers, staged through the host, or run on
//! the CPU, over any `Mover`.

use super::mover::{Mover, Pitched};
use super::rows::{Rows, rows};
use super::view::{Addr, Place, View};
use crate::copy::cpu::copy_strided;
use crate::copy::plan;
use crate::error::{Error, Result};

/// Copy `src` into `dst`: views of the same shape and byte order, of `itemsize`-byte elements,
/// sharing no bytes. Transfers into device memory may still be pending when this returns (the
/// caller syncs when it must); host memory it wrote is complete.
///
/// # Safety
/// Every byte of every element of `dst` is writable, and every byte `src` spans (gaps between
/// its elements included) readable, at their places, and stays so, untouched by anything else,
/// until the mover's next `sync` after this returns (or until this returns, for host memory
/// this writes); the two share no bytes.
pub unsafe fn copy_views<M: Mover>(
    m: &mut M,
    dst: &View,
    src: &View,
    itemsize: usize,
) -> Result<()> {
    let Some(plan) = plan::plan(&dst.shape, &dst.strides, &src.strides) else {
        return Ok(());
    };
    let rows = rows(&plan, itemsize);
    match (dst.base.place, src.base.place) {
        (Place::Host, Place::Host) => {
            m.sync()?;
            // SAFETY: per the contract; nothing is pending after the sync.
            unsafe { cpu(dst, src, itemsize) }
        }
        (Place::Device(a), Place::Device(b)) if a != b => {
            // SAFETY: this function's contract is `between_devices`'s: `dst` writable, `src`
            // readable, untouched until the next sync, sharing no bytes.
            unsafe { between_devices(m, dst, src, itemsize, &rows) }
        }
        _ if rows.count() <= m.tuning().few_rows
            || (rows.width >= m.tuning().wide_row
                && rows.transfers() <= m.tuning().many_transfers) =>
        {
            // SAFETY: the rows address exactly the views' elements, as the contract needs.
            unsafe { transfer(m, dst.base, src.base, &rows) }
        }
        // SAFETY: this function's contract gives what `staged` asks: `dst`'s elements writable,
        // every byte `src` spans readable, until the next sync; no shared bytes.
        _ => unsafe { staged(m, dst, src, itemsize, &rows) },
    }
}

/// The CPU engine on two host views.
///
/// # Safety
/// As for `copy_views`, and no transfer into or out of the views is pending.
unsafe fn cpu(dst: &View, src: &View, itemsize: usize) -> Result<()> {
    if dst.base.place != Place::Host || src.base.place != Place::Host {
        return Err(Error::Runtime(
            "internal error: the CPU engine was handed device memory".into(),
        ));
    }
    let (to, from) = (dst.as_strided(), src.as_strided());
    // SAFETY: per the contract, both views lie in live host memory, share no bytes, and no
    // transfer into or out of them is pending.
    unsafe { copy_strided(&to, &from, itemsize, None) };
    Ok(())
}

/// Send the rows: one transfer per block, rows one by one where the driver refuses a block.
///
/// # Safety
/// The rows from `dst` and `src` address memory as `copy_views` requires.
unsafe fn transfer<M: Mover>(m: &mut M, dst: Addr, src: Addr, rows: &Rows) -> Result<()> {
    let mut index = vec![0usize; rows.loops.len()];
    loop {
        let (mut d, mut s) = (rows.dst_offset, rows.src_offset);
        for (&i, l) in index.iter().zip(&rows.loops) {
            d += i as isize * l.dst;
            s += i as isize * l.src;
        }
        // SAFETY: per the contract, for this block of the rows.
        unsafe { block(m, dst.offset(d), src.offset(s), rows)? };
        // The next block, innermost loop fastest.
        let mut k = index.len();
        loop {
            if k == 0 {
                return Ok(());
            }
            k -= 1;
            index[k] += 1;
            if index[k] < rows.loops[k].n {
                break;
            }
            index[k] = 0;
        }
    }
}

/// One block of rows: one pitched transfer, or its rows one by one.
///
/// # Safety
/// As for `transfer`, for this block.
unsafe fn block<M: Mover>(m: &mut M, dst: Addr, src: Addr, rows: &Rows) -> Result<()> {
    let (h, d) = (rows.height, rows.depth);
    if h.n == 1 && d.n == 1 {
        // SAFETY: per the contract: the block is one row.
        return unsafe { m.linear(dst, src, rows.width) };
    }
    let slices = |stride: isize, pitch: isize| {
        if d.n > 1 {
            (stride / pitch) as usize
        } else {
            h.n
        }
    };
    let pitched = Pitched {
        dst,
        src,
        width: rows.width,
        height: h.n,
        depth: d.n,
        dst_pitch: h.dst as usize,
        src_pitch: h.src as usize,
        dst_rows: slices(d.dst, h.dst),
        src_rows: slices(d.src, h.src),
    };
    // SAFETY: per the contract: the block's rows.
    if unsafe { m.pitched(&pitched)? } {
        return Ok(());
    }
    for z in 0..d.n as isize {
        for y in 0..h.n as isize {
            let (to, from) = (
                dst.offset(z * d.dst + y * h.dst),
                src.offset(z * d.src + y * h.src),
            );
            // SAFETY: per the contract: one row of the block.
            unsafe { m.linear(to, from, rows.width)? };
        }
    }
    Ok(())
}

/// Bring the bytes `view` spans into host memory: the returned view addresses the copy (valid
/// after a sync), kept alive by the scratch.
///
/// # Safety
/// Every byte `view` spans (gaps between its elements included) is readable until the next
/// `sync`.
unsafe fn to_host_span<M: Mover>(
    m: &mut M,
    view: &View,
    itemsize: usize,
) -> Result<(View, M::Scratch)> {
    let (low, high) = view.span(itemsize);
    let (at, keep) = m.scratch(Place::Host, (high - low) as usize)?;
    // SAFETY: per the contract for the source; the scratch is ours, and the caller keeps it
    // until after the next sync.
    unsafe { m.linear(at, view.base.offset(low), (high - low) as usize)? };
    let staged = View {
        base: at.offset(-low),
        shape: view.shape.clone(),
        strides: view.strides.clone(),
    };
    Ok((staged, keep))
}

/// Layouts that would take many small transfers: reorder on the host, move whole spans.
///
/// # Safety
/// As for `copy_views`, and every byte `src` spans is readable (a source is read whole).
unsafe fn staged<M: Mover>(
    m: &mut M,
    dst: &View,
    src: &View,
    itemsize: usize,
    rows: &Rows,
) -> Result<()> {
    let (low, high) = dst.span(itemsize);
    let gapless = (high - low) as usize == dst.numel() * itemsize;
    match (dst.base.place, src.base.place) {
        (Place::Host, _) => {
            // SAFETY: per the contract, `src`'s span is readable.
            let (from, _keep) = unsafe { to_host_span(m, src, itemsize)? };
            m.sync()?;
            // SAFETY: `dst` per the contract, `from` our scratch, complete after the sync.
            unsafe { cpu(dst, &from, itemsize) }
        }
        // The destination's bytes are all its own, so its whole span can be written at once
        // from an image built on the host.
        _ if gapless => {
            let (image, _keep_image) = m.scratch(Place::Host, (high - low) as usize)?;
            let target = View {
                base: image.offset(-low),
                shape: dst.shape.clone(),
                strides: dst.strides.clone(),
            };
            if src.base.place == Place::Host {
                // SAFETY: `target` lies in our scratch, `src` is host memory per the contract.
                unsafe { cpu(&target, src, itemsize)? };
            } else {
                // SAFETY: per the contract, `src`'s span is readable.
                let (from, _keep) = unsafe { to_host_span(m, src, itemsize)? };
                m.sync()?;
                // SAFETY: both in our scratch, `from` complete after the sync.
                unsafe { cpu(&target, &from, itemsize)? };
            }
            // SAFETY: the destination's span is its elements' bytes alone (gapless), writable
            // per the contract; the image is our scratch, kept until after the sync.
            unsafe { m.linear(dst.base.offset(low), image, (high - low) as usize)? };
            m.sync()
        }
        // Writing the span of a destination with gaps would overwrite bytes that aren't ours:
        // without a kernel, rows one by one are the exact way.
        // SAFETY: the rows address exactly the views' elements.
        _ => unsafe { transfer(m, dst.base, src.base, rows) },
    }
}

/// Between two devices: the source made dense on its device, one peer transfer, and the
/// destination filled from a dense buffer on its own device.
///
/// # Safety
/// As for `copy_views`.
unsafe fn between_devices<M: Mover>(
    m: &mut M,
    dst: &View,
    src: &View,
    itemsize: usize,
    rows: &Rows,
) -> Result<()> {
    if rows.is_one_run() {
        let (d, s) = (
            dst.base.offset(rows.dst_offset),
            src.base.offset(rows.src_offset),
        );
        // SAFETY: per the contract: the views are one run each.
        return unsafe { m.linear(d, s, rows.width) };
    }
    let bytes = dst.numel() * itemsize;
    let (near, _keep_near) = m.scratch(src.base.place, bytes)?;
    let near = View::c_order(near, &dst.shape, itemsize);
    // SAFETY: `src` per the contract, `near` our scratch, kept until after the syncs.
    unsafe { copy_views(m, &near, src, itemsize)? };
    // Work on different devices is ordered by the host.
    m.sync()?;
    let (far, _keep_far) = m.scratch(dst.base.place, bytes)?;
    // SAFETY: both our scratch, `near` complete after the sync.
    unsafe { m.linear(far, near.base, bytes)? };
    let far = View::c_order(far, &dst.shape, itemsize);
    // SAFETY: `dst` per the contract, `far` our scratch, kept until after the sync.
    unsafe { copy_views(m, dst, &far, itemsize)? };
    m.sync()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::device::emulator::{emulator, side};
    use crate::copy::device::mover::{TUNING, Tuning};
    use proptest::prelude::*;

    /// The real tuning, or thresholds so low that small cases take the staged paths too.
    fn tuning_strategy() -> impl Strategy<Value = Tuning> {
        prop_oneof![
            Just(TUNING),
            (0usize..8, 1usize..64, 0usize..4).prop_map(|(few_rows, wide_row, many_transfers)| {
                Tuning {
                    few_rows,
                    wide_row,
                    many_transfers,
                }
            }),
        ]
    }

    fn place_strategy() -> impl Strategy<Value = Place> {
        prop_oneof![
            Just(Place::Host),
            Just(Place::Device(0)),
            Just(Place::Device(1))
        ]
    }

    /// Destination steps: a permutation of C order, optionally with gaps and reversed loops
    /// (never overlapping, as a writable array's aren't).
    fn dst_steps(shape: &[usize], order: &[usize], gaps: &[usize], flips: &[bool]) -> Vec<isize> {
        let mut steps = vec![0isize; shape.len()];
        let mut step = 1isize;
        for &k in order.iter().rev() {
            steps[k] = step * gaps[k] as isize;
            step = steps[k] * shape[k] as isize;
        }
        for (s, &f) in steps.iter_mut().zip(flips) {
            if f {
                *s = -*s;
            }
        }
        steps
    }

    /// Shape, destination loop order, gaps and flips, source steps, item size, places, whether
    /// the driver refuses pitched copies between one device's buffers, and the staging tuning.
    type Case = (
        Vec<usize>,
        Vec<usize>,
        Vec<usize>,
        Vec<bool>,
        Vec<isize>,
        usize,
        (Place, Place),
        (bool, Tuning),
    );

    fn copy_case(case: Case) {
        let (shape, order, gaps, flips, src_steps, itemsize, places, (refuse_pitched, tuning)) =
            case;
        let steps = dst_steps(&shape, &order, &gaps, &flips);
        let mut dst = side(&shape, &steps, itemsize, places.0, 0);
        let mut src = side(&shape, &src_steps, itemsize, places.1, 100);
        let before = dst.bytes.clone();
        let mut m = emulator(refuse_pitched, tuning, [&dst, &src]);
        // SAFETY: both views lie in their sides' buffers, which outlive the sync.
        unsafe { copy_views(&mut m, &dst.view(), &src.view(), itemsize).unwrap() };
        m.sync().unwrap();
        // Every element arrived, and no byte outside the destination's elements changed.
        let mut touched = vec![false; dst.bytes.len()];
        let numel: usize = shape.iter().product();
        for flat in 0..numel {
            let mut index = vec![0usize; shape.len()];
            let mut rest = flat;
            for k in (0..shape.len()).rev() {
                index[k] = rest % shape[k];
                rest /= shape[k];
            }
            assert_eq!(
                dst.element(&index, itemsize),
                src.element(&index, itemsize),
                "element {index:?}"
            );
            let at = index
                .iter()
                .zip(&dst.strides)
                .fold(dst.offset as isize, |acc, (&i, &s)| acc + i as isize * s)
                as usize;
            touched[at..at + itemsize]
                .iter_mut()
                .for_each(|t| *t = true);
        }
        for (i, t) in touched.iter().enumerate() {
            if !t {
                assert_eq!(dst.bytes[i], before[i], "byte {i} outside the destination");
            }
        }
    }

    fn case_strategy() -> impl Strategy<Value = Case> {
        (1usize..=4)
            .prop_flat_map(|ndim| {
                (
                    prop::collection::vec(0usize..=6, ndim),
                    Just((0..ndim).collect::<Vec<_>>()).prop_shuffle(),
                    prop::collection::vec(prop_oneof![3 => Just(1usize), 1 => 2usize..=3], ndim),
                    prop::collection::vec(any::<bool>(), ndim),
                    prop::collection::vec(-40isize..=40, ndim),
                    prop_oneof![Just(1usize), Just(2), Just(4), Just(8), Just(16)],
                    (place_strategy(), place_strategy()),
                    (any::<bool>(), tuning_strategy()),
                )
            })
            .prop_filter("at least one side is a device", |c| {
                c.6 != (Place::Host, Place::Host)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1500))]

        #[test]
        fn copies_match_the_reference(case in case_strategy()) {
            copy_case(case);
        }

        /// Sources that are permutations of dense memory, as arrays usually are.
        #[test]
        fn dense_sources_match_the_reference(
            (shape, order, gaps, flips, _src, itemsize, places, driver) in case_strategy(),
            src_order in Just((0..4).collect::<Vec<usize>>()).prop_shuffle(),
        ) {
            let src_order: Vec<usize> = src_order.into_iter().filter(|&k| k < shape.len()).collect();
            let src_steps = dst_steps(&shape, &src_order, &vec![1; shape.len()], &flips);
            copy_case((shape, order, gaps, flips, src_steps, itemsize, places, driver));
        }
    }

    #[test]
    fn large_transpose_to_a_device_is_staged() {
        // 100 x 100 float32 transpose: 10,000 element rows, above FEW_ROWS: the destination is
        // gapless, so one host image and one transfer.
        let n = 100usize;
        let mut dst = side(&[n, n], &[n as isize, 1], 4, Place::Device(0), 0);
        let mut src = side(&[n, n], &[1, n as isize], 4, Place::Host, 9);
        let mut m = emulator(false, TUNING, [&dst, &src]);
        // SAFETY: both views lie in their sides' buffers, separate, which outlive the sync.
        unsafe { copy_views(&mut m, &dst.view(), &src.view(), 4).unwrap() };
        m.sync().unwrap();
        assert_eq!((m.linear_calls, m.pitched_calls), (1, 0));
        assert_eq!(dst.element(&[3, 7], 4), src.element(&[3, 7], 4));
    }

    #[test]
    fn sliced_device_to_host_is_one_pitched_transfer() {
        let mut dst = side(&[64, 32], &[32, 1], 4, Place::Host, 0);
        let mut src = side(&[64, 32], &[100, 1], 4, Place::Device(0), 9);
        let mut m = emulator(false, TUNING, [&dst, &src]);
        // SAFETY: both views lie in their sides' buffers, separate, which outlive the sync.
        unsafe { copy_views(&mut m, &dst.view(), &src.view(), 4).unwrap() };
        m.sync().unwrap();
        assert_eq!((m.linear_calls, m.pitched_calls), (0, 1));
        assert_eq!(dst.element(&[63, 31], 4), src.element(&[63, 31], 4));
    }
}
