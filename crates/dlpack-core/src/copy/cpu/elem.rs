//! How the CPU copy engine copies one element ([`Elem`]): unchanged ([`Plain`]), byte-swapped
//! per unit ([`Swapped`]), or of any other size ([`Dyn`]). The kernels are generic over it, so
//! each item size (and byte swap) gets its own compiled loops with constant element strides.

use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr::{copy_nonoverlapping, read_unaligned, write_unaligned};

/// How to copy one element.
pub trait Elem: Copy {
    /// Bytes per element.
    fn size(self) -> usize;
    /// Whether elements are copied unchanged (so runs of them can be `memcpy`d).
    fn plain(self) -> bool;
    /// Copy one element. Non-plain elements are read before they are written, so `src` may
    /// equal `dst` for them (an in-place byte swap).
    ///
    /// # Safety
    /// `size()` bytes at `src` readable, at `dst` writable (any alignment).
    unsafe fn copy(self, src: *const u8, dst: *mut u8);

    /// Copy `n` elements from every other element of the source to a dense destination run.
    ///
    /// # Safety
    /// Source elements `0, 2, .., 2 (n - 1)` readable, destination elements `0..n` writable.
    #[inline(always)]
    unsafe fn gather2(self, src: *const u8, dst: *mut u8, n: usize) {
        let size = self.size();
        for i in 0..n {
            let (s, d) = (src.wrapping_add(2 * i * size), dst.wrapping_add(i * size));
            // SAFETY: source element 2 i and destination element i, valid per the contract.
            unsafe { self.copy(s, d) };
        }
    }
}

/// An element copied unchanged, `size_of::<T>()` bytes.
pub struct Plain<T>(PhantomData<T>);

impl<T> Plain<T> {
    pub const fn new() -> Self {
        Plain(PhantomData)
    }
}

impl<T> Clone for Plain<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Plain<T> {}

impl<T: Copy> Elem for Plain<T> {
    #[inline(always)]
    fn size(self) -> usize {
        size_of::<T>()
    }
    #[inline(always)]
    fn plain(self) -> bool {
        true
    }
    #[inline(always)]
    unsafe fn copy(self, src: *const u8, dst: *mut u8) {
        // SAFETY: `size_of::<T>()` bytes at `src` are readable (the trait contract); unaligned.
        let v = unsafe { read_unaligned(src.cast::<T>()) };
        // SAFETY: `size_of::<T>()` bytes at `dst` are writable (the trait contract); unaligned.
        unsafe { write_unaligned(dst.cast::<T>(), v) }
    }

    /// Eight at a time: read 16 items, keep the even ones (vector shuffles).
    #[inline(always)]
    unsafe fn gather2(self, src: *const u8, dst: *mut u8, n: usize) {
        const K: usize = 8;
        let z = size_of::<T>();
        // A chunk reads one item past its last even one: leave the last element to the tail
        // so that nothing beyond source element 2 (n - 1) is read.
        let chunks = n.saturating_sub(1) / K;
        for c in 0..chunks {
            let s = src.wrapping_add(2 * K * c * z).cast::<[T; 2 * K]>();
            // SAFETY: source items 2 K c .. 2 K (c + 1) - 1 <= 2 (n - 1) are readable.
            let v = unsafe { read_unaligned(s) };
            let out: [T; K] = std::array::from_fn(|i| v[2 * i]);
            // SAFETY: destination items K c .. K (c + 1) <= n are writable.
            unsafe { write_unaligned(dst.wrapping_add(K * c * z).cast::<[T; K]>(), out) };
        }
        for i in chunks * K..n {
            let (s, d) = (src.wrapping_add(2 * i * z), dst.wrapping_add(i * z));
            // SAFETY: source element 2 i and destination element i, valid per the contract.
            unsafe { self.copy(s, d) };
        }
    }
}

/// An integer whose bytes can be reversed: one byte-swap unit.
pub trait Unit: Copy {
    fn swapped(self) -> Self;
}

macro_rules! unit {
    ($($t:ty),*) => {$(
        impl Unit for $t {
            #[inline(always)]
            fn swapped(self) -> Self {
                self.swap_bytes()
            }
        }
    )*};
}
unit!(u16, u32, u64, u128);

/// An element of `size_of::<T>()` bytes made of `U` units, each byte-reversed while copying
/// (a non-native byte order source; complex numbers swap per component).
pub struct Swapped<T, U>(PhantomData<(T, U)>);

impl<T, U> Swapped<T, U> {
    pub const fn new() -> Self {
        Swapped(PhantomData)
    }
}

impl<T, U> Clone for Swapped<T, U> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, U> Copy for Swapped<T, U> {}

impl<T: Copy, U: Unit> Elem for Swapped<T, U> {
    #[inline(always)]
    fn size(self) -> usize {
        size_of::<T>()
    }
    #[inline(always)]
    fn plain(self) -> bool {
        false
    }
    #[inline(always)]
    unsafe fn copy(self, src: *const u8, dst: *mut u8) {
        let unit = size_of::<U>();
        for k in 0..size_of::<T>() / unit {
            let (s, d) = (src.wrapping_add(k * unit), dst.wrapping_add(k * unit));
            // SAFETY: unit k lies inside the source element, readable per the trait contract.
            let v = unsafe { read_unaligned(s.cast::<U>()) };
            // SAFETY: unit k lies inside the destination element, writable per the trait
            // contract; unaligned.
            unsafe { write_unaligned(d.cast::<U>(), v.swapped()) };
        }
    }
}

/// Any other element: `size` bytes, byte-reversed per `unit` bytes when `unit > 1`.
#[derive(Clone, Copy)]
pub struct Dyn {
    pub size: usize,
    pub unit: usize,
}

impl Elem for Dyn {
    #[inline(always)]
    fn size(self) -> usize {
        self.size
    }
    #[inline(always)]
    fn plain(self) -> bool {
        self.unit <= 1
    }
    #[inline(always)]
    unsafe fn copy(self, src: *const u8, dst: *mut u8) {
        if self.unit <= 1 {
            // SAFETY: per the trait contract.
            unsafe { copy_nonoverlapping(src, dst, self.size) };
            return;
        }
        // The caller makes `unit` divide `size`. Bytes are exchanged pairwise, each pair read
        // before it is written, so `src == dst` (an in-place swap) works.
        let unit = self.unit;
        let mut k = 0;
        while k + unit <= self.size {
            for b in 0..unit.div_ceil(2) {
                let (lo, hi) = (k + b, k + unit - 1 - b);
                // SAFETY: bytes lo and hi lie inside the source element, readable.
                let x = unsafe { src.wrapping_add(lo).read() };
                // SAFETY: byte hi < k + unit <= size lies inside the source element, readable
                // (the trait contract).
                let y = unsafe { src.wrapping_add(hi).read() };
                // SAFETY: byte lo < hi lies inside the destination element, writable (the
                // trait contract).
                unsafe { dst.wrapping_add(lo).write(y) };
                // SAFETY: byte hi < k + unit <= size lies inside the destination element,
                // writable (the trait contract).
                unsafe { dst.wrapping_add(hi).write(x) };
            }
            k += unit;
        }
    }
}
