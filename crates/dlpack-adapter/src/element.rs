//! The Rust element types an array's memory can be read as, each tied to its DLPack type.

use dlpack_core::abi::type_code as tc;
use dlpack_core::dtype::DType;

/// A Rust type whose values DLPack memory of `DTYPE` holds, byte for byte.
///
/// # Safety
/// `Self` has size `DTYPE.itemsize()`, no padding, and every bit pattern of that size that
/// `valid` accepts is a valid `Self` (`valid` is asked before memory is read as `Self`).
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The DLPack element type of `Self`.
    const DTYPE: DType;

    /// Whether some bit patterns of its size are no valid `Self`, so that memory must be
    /// checked (`valid`) before it is read as `Self`.
    const CHECKED: bool = false;

    /// Whether every element in `bytes` (whole elements, native byte order) is a valid `Self`.
    #[inline]
    fn valid(bytes: &[u8]) -> bool {
        let _ = bytes;
        true
    }
}

macro_rules! element {
    ($($ty:ty => $code:expr;)*) => {$(
        // SAFETY: a plain number of exactly that width: every bit pattern is valid.
        unsafe impl Element for $ty {
            const DTYPE: DType = DType::new($code, (8 * std::mem::size_of::<$ty>()) as u8);
        }
    )*};
}

element! {
    i8 => tc::INT; i16 => tc::INT; i32 => tc::INT; i64 => tc::INT;
    u8 => tc::UINT; u16 => tc::UINT; u32 => tc::UINT; u64 => tc::UINT;
    f32 => tc::FLOAT; f64 => tc::FLOAT;
}

#[cfg(feature = "half")]
element! {
    half::f16 => tc::FLOAT;
    half::bf16 => tc::BFLOAT;
}

#[cfg(feature = "num-complex")]
element! {
    num_complex::Complex<f32> => tc::COMPLEX;
    num_complex::Complex<f64> => tc::COMPLEX;
}

// SAFETY: one byte; `valid` admits only 0 and 1, the two bit patterns of a Rust `bool`.
unsafe impl Element for bool {
    const DTYPE: DType = DType::new(tc::BOOL, 8);
    const CHECKED: bool = true;

    fn valid(bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| b <= 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_dlpack_types() {
        fn check<T: Element>() {
            assert_eq!(T::DTYPE.itemsize(), std::mem::size_of::<T>());
        }
        check::<bool>();
        check::<i8>();
        check::<i64>();
        check::<u16>();
        check::<f32>();
        check::<f64>();
        assert_eq!(f32::DTYPE.name(), "float32");
        assert_eq!(u64::DTYPE.name(), "uint64");
        assert_eq!(bool::DTYPE.name(), "bool");
    }

    #[test]
    fn bool_accepts_only_zero_and_one() {
        assert!(bool::valid(&[0, 1, 1, 0]));
        assert!(!bool::valid(&[0, 2]));
        assert!(f32::valid(&[0xff; 8]));
    }
}
