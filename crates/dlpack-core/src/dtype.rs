//! Element types: the DLPack `DLDataType`, its names, and the parsers that produce it from
//! PEP 3118 buffer formats and array-interface `typestr`s.

use std::ffi::CStr;

use crate::abi::{DLDataType, type_code as tc};
use crate::error::{Error, Result};

/// An element type DLPack can carry (always one lane, whole bytes, native byte order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DType(pub DLDataType);

/// Names of the types we accept, with their DLPack code and bit width. The `ml_dtypes` names
/// (bfloat16, float8_*) double as the lookup table for numpy arrays of those types.
const NAMED: &[(&str, u8, u8)] = &[
    ("bool", tc::BOOL, 8),
    ("int8", tc::INT, 8),
    ("int16", tc::INT, 16),
    ("int32", tc::INT, 32),
    ("int64", tc::INT, 64),
    ("uint8", tc::UINT, 8),
    ("uint16", tc::UINT, 16),
    ("uint32", tc::UINT, 32),
    ("uint64", tc::UINT, 64),
    ("float16", tc::FLOAT, 16),
    ("float32", tc::FLOAT, 32),
    ("float64", tc::FLOAT, 64),
    ("complex64", tc::COMPLEX, 64),
    ("complex128", tc::COMPLEX, 128),
    ("bfloat16", tc::BFLOAT, 16),
    ("float8_e3m4", tc::FLOAT8_E3M4, 8),
    ("float8_e4m3", tc::FLOAT8_E4M3, 8),
    ("float8_e4m3b11fnuz", tc::FLOAT8_E4M3B11FNUZ, 8),
    ("float8_e4m3fn", tc::FLOAT8_E4M3FN, 8),
    ("float8_e4m3fnuz", tc::FLOAT8_E4M3FNUZ, 8),
    ("float8_e5m2", tc::FLOAT8_E5M2, 8),
    ("float8_e5m2fnuz", tc::FLOAT8_E5M2FNUZ, 8),
    ("float8_e8m0fnu", tc::FLOAT8_E8M0FNU, 8),
];

impl DType {
    pub const fn new(code: u8, bits: u8) -> Self {
        DType(DLDataType {
            code,
            bits,
            lanes: 1,
        })
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        (self.0.bits as usize * self.0.lanes as usize).div_ceil(8)
    }

    /// The unit whose bytes a byte-order swap reverses: the component of a complex number,
    /// otherwise the whole element.
    pub fn swap_unit(self) -> usize {
        if self.0.code == tc::COMPLEX {
            self.itemsize() / 2
        } else {
            self.itemsize()
        }
    }

    /// The conventional name ("float32", "bfloat16", ...).
    pub fn name(self) -> String {
        let DLDataType { code, bits, lanes } = self.0;
        let base = NAMED
            .iter()
            .find(|(_, c, b)| *c == code && *b == bits)
            .map(|(name, _, _)| (*name).to_owned())
            .unwrap_or_else(|| format!("dltype(code={code}, bits={bits})"));
        if lanes == 1 {
            base
        } else {
            format!("{base}x{lanes}")
        }
    }

    /// Every type we name, with its name, in a fixed order.
    pub fn named() -> impl Iterator<Item = (&'static str, DType)> {
        NAMED
            .iter()
            .map(|&(name, code, bits)| (name, DType::new(code, bits)))
    }

    /// The type of an `ml_dtypes`-style name, e.g. `"bfloat16"`.
    pub fn from_name(name: &str) -> Option<Self> {
        NAMED
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|&(_, code, bits)| DType::new(code, bits))
    }

    /// Check a type received from a DLPack producer: only whole-byte types with codes we know.
    pub fn from_dlpack(dt: DLDataType) -> Result<Self> {
        let known = NAMED.iter().any(|&(_, c, b)| c == dt.code && b == dt.bits);
        if !known || dt.lanes != 1 {
            return Err(Error::buffer(format!(
                "unsupported DLPack data type (code={}, bits={}, lanes={})",
                dt.code, dt.bits, dt.lanes
            )));
        }
        Ok(DType(dt))
    }
}

/// How the protocols that describe memory to Python consumers (PEP 3118 buffers, the array
/// interfaces) spell each type. bfloat16 and the float8 types have no code in either: they are
/// described as raw bytes of their size, as numpy describes them (`V`, PEP 3118 `x`).
impl DType {
    /// The array interface's kind: `b`, `i`, `u`, `f`, `c`, or `V` for raw bytes.
    pub fn typekind(self) -> u8 {
        match self.0.code {
            tc::BOOL => b'b',
            tc::INT => b'i',
            tc::UINT => b'u',
            tc::FLOAT => b'f',
            tc::COMPLEX => b'c',
            _ => b'V',
        }
    }

    /// The array interface's type string, e.g. `"<f4"` (`swapped`: in the other byte order).
    pub fn typestr(self, swapped: bool) -> String {
        let kind = self.typekind();
        let order = if self.itemsize() == 1 || kind == b'V' {
            '|'
        } else if cfg!(target_endian = "little") != swapped {
            '<'
        } else {
            '>'
        };
        format!("{order}{}{}", kind as char, self.itemsize())
    }

    /// The PEP 3118 format (`swapped`: in the other byte order, spelled with `<` or `>`); None
    /// for the types PEP 3118 has no code for (bfloat16, the float8 types). Pad bytes (`2x`)
    /// would be no answer: numpy reads them as a struct without fields and copies nothing.
    pub fn buffer_format(self, swapped: bool) -> Option<&'static CStr> {
        let little = cfg!(target_endian = "little") != swapped;
        let ordered = |native: &'static CStr, little_end: &'static CStr, big: &'static CStr| match (
            swapped, little,
        ) {
            (false, _) => native,
            (true, true) => little_end,
            (true, false) => big,
        };
        let format = match (self.0.code, self.0.bits) {
            (tc::BOOL, 8) => c"?",
            (tc::INT, 8) => c"b",
            (tc::UINT, 8) => c"B",
            (tc::INT, 16) => ordered(c"h", c"<h", c">h"),
            (tc::UINT, 16) => ordered(c"H", c"<H", c">H"),
            (tc::INT, 32) => ordered(c"i", c"<i", c">i"),
            (tc::UINT, 32) => ordered(c"I", c"<I", c">I"),
            (tc::INT, 64) => ordered(c"q", c"<q", c">q"),
            (tc::UINT, 64) => ordered(c"Q", c"<Q", c">Q"),
            (tc::FLOAT, 16) => ordered(c"e", c"<e", c">e"),
            (tc::FLOAT, 32) => ordered(c"f", c"<f", c">f"),
            (tc::FLOAT, 64) => ordered(c"d", c"<d", c">d"),
            (tc::COMPLEX, 64) => ordered(c"Zf", c"<Zf", c">Zf"),
            (tc::COMPLEX, 128) => ordered(c"Zd", c"<Zd", c">Zd"),
            _ => return None,
        };
        Some(format)
    }
}

fn int(signed: bool, bytes: usize) -> DType {
    DType::new(if signed { tc::INT } else { tc::UINT }, (bytes * 8) as u8)
}

/// An element type as a source stores it: DLPack type and whether its bytes are swapped
/// relative to this machine (then only a copy can serve it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredType {
    pub dtype: DType,
    pub swapped: bool,
}

/// Parse a PEP 3118 `struct`-style format of one element, checking it against `itemsize`.
///
/// Accepts an optional byte-order prefix (`@ = < > !`) and one of `? b B h H i I l L q Q n N e f
/// d Zf Zd`. Native-size (`@`) and standard-size prefixes differ only for `l`/`L`; since ctypes
/// writes `<l` for an 8-byte C long, either size is accepted there, always checked against the
/// buffer's `itemsize`.
pub fn parse_buffer_format(format: &[u8], itemsize: usize) -> Result<StoredType> {
    let unsupported = || {
        Error::buffer(format!(
            "buffer format {:?} is not a DLPack type (numeric scalars only)",
            String::from_utf8_lossy(format)
        ))
    };
    let (order, code) = match format.first() {
        Some(&c @ (b'@' | b'=' | b'<' | b'>' | b'!')) => (c, &format[1..]),
        _ => (b'@', format),
    };
    let native = order == b'@';
    let (dtype, sizes): (DType, &[usize]) = match code {
        b"?" => (DType::new(tc::BOOL, 8), &[1]),
        b"b" => (int(true, 1), &[1]),
        b"B" => (int(false, 1), &[1]),
        b"h" => (int(true, 2), &[2]),
        b"H" => (int(false, 2), &[2]),
        b"i" => (int(true, 4), &[4]),
        b"I" => (int(false, 4), &[4]),
        // C long: 4 or 8 bytes depending on the platform and on who wrote the format.
        b"l" | b"L" => (
            int(code == b"l", if itemsize == 4 { 4 } else { 8 }),
            &[4, 8],
        ),
        b"q" => (int(true, 8), &[8]),
        b"Q" => (int(false, 8), &[8]),
        b"n" | b"N" if native => (int(code == b"n", size_of::<isize>()), &[size_of::<isize>()]),
        b"e" => (DType::new(tc::FLOAT, 16), &[2]),
        b"f" => (DType::new(tc::FLOAT, 32), &[4]),
        b"d" => (DType::new(tc::FLOAT, 64), &[8]),
        b"Zf" => (DType::new(tc::COMPLEX, 64), &[8]),
        b"Zd" => (DType::new(tc::COMPLEX, 128), &[16]),
        _ => return Err(unsupported()),
    };
    if !sizes.contains(&itemsize) || dtype.itemsize() != itemsize {
        return Err(size_mismatch(format, itemsize));
    }
    Ok(StoredType {
        dtype,
        swapped: is_swapped(order, itemsize),
    })
}

fn size_mismatch(format: &[u8], itemsize: usize) -> Error {
    Error::value(format!(
        "buffer format {:?} does not match its itemsize {itemsize}",
        String::from_utf8_lossy(format)
    ))
}

/// Whether a byte-order mark means bytes swapped relative to this machine (DLPack data is in
/// native order). One-byte types have no order.
fn is_swapped(order: u8, itemsize: usize) -> bool {
    let little = cfg!(target_endian = "little");
    let swapped = match order {
        b'<' => !little,
        b'>' | b'!' => little,
        _ => false,
    };
    swapped && itemsize > 1
}

/// What an array-interface `typestr` (e.g. `"<f4"`) says.
#[derive(Debug, PartialEq, Eq)]
pub enum TypeStr {
    /// A type DLPack carries.
    Known(StoredType),
    /// Opaque bytes (`V` kind, or numpy's `f1` for `ml_dtypes.float8_e5m2`): the element type
    /// must come from the object's `dtype` name.
    Opaque { itemsize: usize, swapped: bool },
}

/// Parse an array-interface `typestr`: byte order (`< > | =`), kind, item size in bytes.
pub fn parse_typestr(typestr: &str) -> Result<TypeStr> {
    let bytes = typestr.as_bytes();
    let malformed = || Error::value(format!("malformed typestr {typestr:?}"));
    if bytes.len() < 3 || !matches!(bytes[0], b'<' | b'>' | b'|' | b'=') {
        return Err(malformed());
    }
    let kind = bytes[1];
    let size_digits = &bytes[2..];
    let end = memchr::memchr(b'[', size_digits).unwrap_or(size_digits.len());
    let digits = &size_digits[..end];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(malformed());
    }
    let itemsize: usize = std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .ok_or_else(malformed)?;
    if end != size_digits.len() && !matches!(kind, b'M' | b'm') {
        return Err(malformed());
    }
    let unsupported =
        |what: &str| Error::buffer(format!("typestr {typestr:?} ({what}) is not a DLPack type"));
    let dtype = match (kind, itemsize) {
        (b'b', 1) => DType::new(tc::BOOL, 8),
        (b'i', 1 | 2 | 4 | 8) => int(true, itemsize),
        (b'u', 1 | 2 | 4 | 8) => int(false, itemsize),
        (b'f', 2 | 4 | 8) => DType::new(tc::FLOAT, (itemsize * 8) as u8),
        (b'c', 8 | 16) => DType::new(tc::COMPLEX, (itemsize * 8) as u8),
        (b'f', 1) | (b'V', _) => {
            return Ok(TypeStr::Opaque {
                itemsize,
                swapped: is_swapped(bytes[0], itemsize),
            });
        }
        (b'f' | b'c', _) => return Err(unsupported("extended precision")),
        (b'b' | b'i' | b'u', _) => return Err(malformed()),
        (b'O', _) => return Err(unsupported("Python objects")),
        (b'S' | b'U' | b'a', _) => return Err(unsupported("strings")),
        (b'M' | b'm', _) => return Err(unsupported("datetime")),
        (b't', _) => return Err(unsupported("bit field")),
        _ => return Err(malformed()),
    };
    Ok(TypeStr::Known(StoredType {
        dtype,
        swapped: is_swapped(bytes[0], itemsize),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buffer_formats() {
        let native = |dtype| StoredType {
            dtype,
            swapped: false,
        };
        let f32 = DType::new(tc::FLOAT, 32);
        assert_eq!(parse_buffer_format(b"f", 4).unwrap(), native(f32));
        assert_eq!(parse_buffer_format(b"<f", 4).unwrap(), native(f32));
        assert_eq!(parse_buffer_format(b"=f", 4).unwrap(), native(f32));
        let swapped = StoredType {
            dtype: f32,
            swapped: true,
        };
        assert_eq!(parse_buffer_format(b">f", 4).unwrap(), swapped);
        assert_eq!(parse_buffer_format(b"!f", 4).unwrap(), swapped);
        assert_eq!(
            parse_buffer_format(b">B", 1).unwrap(),
            native(int(false, 1))
        );
        assert!(matches!(parse_buffer_format(b"f", 8), Err(Error::Value(_))));
        assert_eq!(parse_buffer_format(b"<l", 8).unwrap(), native(int(true, 8)));
        assert_eq!(parse_buffer_format(b"=l", 4).unwrap(), native(int(true, 4)));
        let c128 = DType::new(tc::COMPLEX, 128);
        assert_eq!(parse_buffer_format(b"Zd", 16).unwrap(), native(c128));
        assert_eq!(c128.swap_unit(), 8);
        let boolean = DType::new(tc::BOOL, 8);
        assert_eq!(parse_buffer_format(b"?", 1).unwrap(), native(boolean));
        for bad in [
            &b"g"[..],
            b"O",
            b"T{f:x:}",
            b"2f",
            b"",
            b"c",
            b"x",
            b"=n",
            b"Zg",
        ] {
            assert!(parse_buffer_format(bad, 4).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn typestrs() {
        let known = |dtype, swapped| TypeStr::Known(StoredType { dtype, swapped });
        let f32 = DType::new(tc::FLOAT, 32);
        assert_eq!(parse_typestr("<f4").unwrap(), known(f32, false));
        assert_eq!(
            parse_typestr("|b1").unwrap(),
            known(DType::new(tc::BOOL, 8), false)
        );
        assert_eq!(parse_typestr("|u1").unwrap(), known(int(false, 1), false));
        assert_eq!(parse_typestr(">u1").unwrap(), known(int(false, 1), false));
        let opaque = TypeStr::Opaque {
            itemsize: 2,
            swapped: false,
        };
        assert_eq!(parse_typestr("<V2").unwrap(), opaque);
        assert_eq!(
            parse_typestr(">f8").unwrap(),
            known(DType::new(tc::FLOAT, 64), true)
        );
        assert!(matches!(parse_typestr("<f16"), Err(Error::Buffer(_))));
        assert!(matches!(parse_typestr("|O8"), Err(Error::Buffer(_))));
        assert!(matches!(parse_typestr("<M8[ns]"), Err(Error::Buffer(_))));
        assert!(matches!(parse_typestr("<U3"), Err(Error::Buffer(_))));
        for bad in ["", "f4", "<f", "<x4", "<i3", "<f0", "<f4[", "<b2", "<fa"] {
            assert!(matches!(parse_typestr(bad), Err(Error::Value(_))), "{bad}");
        }
    }

    #[test]
    fn names_round_trip() {
        for &(name, code, bits) in NAMED {
            let dt = DType::from_name(name).unwrap();
            assert_eq!(dt.name(), name);
            assert_eq!(
                DType::from_dlpack(DLDataType {
                    code,
                    bits,
                    lanes: 1
                })
                .unwrap(),
                dt
            );
        }
        assert!(
            DType::from_dlpack(DLDataType {
                code: tc::FLOAT,
                bits: 32,
                lanes: 4
            })
            .is_err()
        );
        assert!(
            DType::from_dlpack(DLDataType {
                code: 99,
                bits: 8,
                lanes: 1
            })
            .is_err()
        );
    }

    /// What a reference parse expects: a DLPack type (code, bits) and whether its bytes are
    /// swapped; opaque bytes; or the error class (`true`: malformed, a `ValueError`; `false`:
    /// well formed but not a DLPack type, a `BufferError`).
    #[derive(Debug, PartialEq)]
    enum Expect {
        Known(u8, u8, bool),
        Opaque(usize, bool),
        Malformed,
        NotDlpack,
    }

    /// Whether a byte-order mark names the order this machine doesn't use, for a multibyte item.
    fn foreign(order: char, itemsize: usize) -> bool {
        let foreign = if cfg!(target_endian = "little") {
            matches!(order, '>' | '!')
        } else {
            order == '<'
        };
        foreign && itemsize > 1
    }

    /// Reference from numpy's array interface spec: `typestr` is a byte order (`<` little, `>`
    /// big, `|` not relevant, `=` native: no `!`, no `@`), a kind code, and the item size in
    /// bytes as decimal digits; datetimes (`M`, `m`) may carry a unit in brackets. Of the kinds,
    /// `b i u f c` with the sizes DLPack has are types; `V` (and numpy's `f1` for ml_dtypes'
    /// float8) are raw bytes; `t O S U a M m` and wider floats are real kinds DLPack lacks.
    fn typestr_reference(order: char, kind: char, digits: &str, unit: &str) -> Expect {
        let size = match digits.parse::<usize>() {
            Ok(n) if n > 0 && digits.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Expect::Malformed,
        };
        if !"<>|=".contains(order) || (!unit.is_empty() && !"Mm".contains(kind)) {
            return Expect::Malformed;
        }
        let swapped = foreign(order, size);
        let table: &[(char, usize, u8)] = &[
            ('b', 1, tc::BOOL),
            ('i', 1, tc::INT),
            ('i', 2, tc::INT),
            ('i', 4, tc::INT),
            ('i', 8, tc::INT),
            ('u', 1, tc::UINT),
            ('u', 2, tc::UINT),
            ('u', 4, tc::UINT),
            ('u', 8, tc::UINT),
            ('f', 2, tc::FLOAT),
            ('f', 4, tc::FLOAT),
            ('f', 8, tc::FLOAT),
            ('c', 8, tc::COMPLEX),
            ('c', 16, tc::COMPLEX),
        ];
        if let Some(&(_, _, code)) = table.iter().find(|t| t.0 == kind && t.1 == size) {
            return Expect::Known(code, (size * 8) as u8, swapped);
        }
        match kind {
            'V' => Expect::Opaque(size, swapped),
            'f' if size == 1 => Expect::Opaque(size, swapped),
            // numpy has no other sizes of these kinds: "<i3" describes nothing.
            'b' | 'i' | 'u' => Expect::Malformed,
            'f' | 'c' | 't' | 'O' | 'S' | 'U' | 'a' | 'M' | 'm' => Expect::NotDlpack,
            _ => Expect::Malformed,
        }
    }

    fn observed_typestr(parsed: Result<TypeStr>) -> Expect {
        match parsed {
            Ok(TypeStr::Known(el)) => {
                assert_eq!(el.dtype.0.lanes, 1);
                Expect::Known(el.dtype.0.code, el.dtype.0.bits, el.swapped)
            }
            Ok(TypeStr::Opaque { itemsize, swapped }) => Expect::Opaque(itemsize, swapped),
            Err(Error::Value(_)) => Expect::Malformed,
            Err(Error::Buffer(_)) => Expect::NotDlpack,
            Err(other) => panic!("unexpected error class: {other:?}"),
        }
    }

    /// Reference from Python's `struct` module (and PEP 3118's `Z` complex prefix): a byte-order
    /// prefix, then one code. `@` (or none) is native order and size, `= < > !` standard sizes,
    /// where `n`/`N` don't exist. `l`/`L` are taken at 4 or 8 bytes whatever the prefix,
    /// because ctypes writes `<l` for an 8-byte C long. Other codes (`g`, `Zg`, `c`, `s`, `p`,
    /// `x`, `O`, structs) and misspelt ones are not DLPack types; neither is a bad prefix.
    fn format_reference(prefix: &str, code: &str, itemsize: usize) -> Expect {
        let native = prefix.is_empty() || prefix == "@";
        let (kind, sizes): (u8, &[usize]) = match code {
            "?" => (tc::BOOL, &[1]),
            "b" => (tc::INT, &[1]),
            "B" => (tc::UINT, &[1]),
            "h" => (tc::INT, &[2]),
            "H" => (tc::UINT, &[2]),
            "i" => (tc::INT, &[4]),
            "I" => (tc::UINT, &[4]),
            "l" => (tc::INT, &[4, 8]),
            "L" => (tc::UINT, &[4, 8]),
            "q" => (tc::INT, &[8]),
            "Q" => (tc::UINT, &[8]),
            "n" if native => (tc::INT, &[size_of::<isize>()]),
            "N" if native => (tc::UINT, &[size_of::<usize>()]),
            "e" => (tc::FLOAT, &[2]),
            "f" => (tc::FLOAT, &[4]),
            "d" => (tc::FLOAT, &[8]),
            "Zf" => (tc::COMPLEX, &[8]),
            "Zd" => (tc::COMPLEX, &[16]),
            _ => return Expect::NotDlpack,
        };
        if !"@=<>!".contains(prefix) || prefix.len() > 1 {
            return Expect::NotDlpack;
        }
        if !sizes.contains(&itemsize) {
            return Expect::Malformed;
        }
        let order = prefix.chars().next().unwrap_or('@');
        Expect::Known(kind, (itemsize * 8) as u8, foreign(order, itemsize))
    }

    fn observed_format(parsed: Result<StoredType>) -> Expect {
        match parsed {
            Ok(el) => {
                assert_eq!(el.dtype.0.lanes, 1);
                Expect::Known(el.dtype.0.code, el.dtype.0.bits, el.swapped)
            }
            Err(Error::Value(_)) => Expect::Malformed,
            Err(Error::Buffer(_)) => Expect::NotDlpack,
            Err(other) => panic!("unexpected error class: {other:?}"),
        }
    }

    #[test]
    fn every_type_round_trips_through_its_spellings() {
        for (name, dt) in DType::named() {
            for swapped in [false, true] {
                let parsed = parse_typestr(&dt.typestr(swapped)).unwrap();
                let expected = match dt.typekind() {
                    // Raw bytes are written `|` whatever the order (so `swapped` is lost).
                    b'V' => TypeStr::Opaque {
                        itemsize: dt.itemsize(),
                        swapped: false,
                    },
                    _ => TypeStr::Known(StoredType {
                        dtype: dt,
                        swapped: swapped && dt.itemsize() > 1,
                    }),
                };
                assert_eq!(parsed, expected, "{name} swapped={swapped}");
                match dt
                    .buffer_format(swapped)
                    .map(|f| parse_buffer_format(f.to_bytes(), dt.itemsize()))
                {
                    // bfloat16 and the float8 types have no PEP 3118 code.
                    None => assert_eq!(dt.typekind(), b'V', "{name}"),
                    Some(Err(e)) => panic!("{name}: its own format is refused: {e}"),
                    Some(Ok(el)) => assert_eq!(
                        el,
                        StoredType {
                            dtype: dt,
                            swapped: swapped && dt.itemsize() > 1,
                        },
                        "{name}"
                    ),
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn buffer_format_never_panics(fmt in proptest::collection::vec(any::<u8>(), 0..6),
                                      itemsize in 0usize..20) {
            let _ = parse_buffer_format(&fmt, itemsize);
        }

        /// Every prefix and code `struct` knows, plus ones it doesn't, repeat counts, and any
        /// item size: the parse agrees with the reference on type, size, byte order and the
        /// class of error.
        #[test]
        fn buffer_format_matches_struct(
            prefix in prop_oneof![
                5 => proptest::sample::select(vec!["", "@", "=", "<", ">", "!"]),
                1 => proptest::sample::select(vec!["#", "<>", "^"]),
            ],
            code in proptest::sample::select(vec![
                "?", "b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "n", "N", "e", "f", "d",
                "g", "Zf", "Zd", "Zg", "Ze", "Z", "c", "s", "p", "P", "x", "O", "T{f}", "", "F",
                "D", "w", "u"]),
            count in prop_oneof![4 => Just(""), 1 => proptest::sample::select(vec!["2", "10", "0"])],
            itemsize in prop_oneof![3 => proptest::sample::select(vec![1usize, 2, 4, 8, 16]),
                                    1 => 0usize..40],
        ) {
            let fmt = format!("{prefix}{count}{code}");
            let parsed = observed_format(parse_buffer_format(fmt.as_bytes(), itemsize));
            if count.is_empty() {
                prop_assert_eq!(parsed, format_reference(prefix, code, itemsize), "{:?}", fmt);
            } else {
                // A count other than 1 is not one element (`0f` is none): never a scalar type.
                prop_assert!(!matches!(parsed, Expect::Known(..)), "{:?}", fmt);
            }
        }

        /// A count of 1 is one element: if the parser takes it at all, it means the bare code.
        #[test]
        fn buffer_format_count_of_one(
            prefix in proptest::sample::select(vec!["", "@", "=", "<", ">", "!"]),
            code in proptest::sample::select(vec![
                "?", "b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "n", "N", "e", "f", "d",
                "Zf", "Zd"]),
            itemsize in proptest::sample::select(vec![1usize, 2, 4, 8, 16]),
        ) {
            let one = parse_buffer_format(format!("{prefix}1{code}").as_bytes(), itemsize);
            if let Ok(el) = one {
                let bare = parse_buffer_format(format!("{prefix}{code}").as_bytes(), itemsize);
                prop_assert_eq!(Ok(el), bare.map_err(|_| ()));
            }
        }

        #[test]
        fn typestr_never_panics(s in "\\PC{0,8}") {
            let _ = parse_typestr(&s);
        }

        /// Any byte order mark (the spec's four and `!`, `@`, others), any kind letter numpy
        /// defines plus some it doesn't, item sizes in and out of range, spelled with leading
        /// zeros or not at all, and datetime units: code, bits, byte order and error class
        /// agree with the reference.
        #[test]
        fn typestr_matches_spec(
            // Weighted towards the spec's marks and sizes, so each valid type comes up often.
            order in prop_oneof![
                4 => proptest::sample::select(vec!['<', '>', '|', '=']),
                1 => proptest::sample::select(vec!['!', '@', 'x']),
            ],
            kind in proptest::sample::select(
                "biufcVtOSUaMm?xBIgdFZ".chars().collect::<Vec<_>>()),
            digits in prop_oneof![
                4 => proptest::sample::select(vec![1usize, 2, 4, 8, 16]).prop_map(|n| n.to_string()),
                2 => (0usize..=33).prop_map(|n| n.to_string()),
                1 => proptest::sample::select(vec![
                    String::new(), "04".to_owned(), "+4".to_owned(), "4 ".to_owned(),
                    "99999999999999999999999".to_owned(), "-1".to_owned()]),
            ],
            unit in prop_oneof![4 => Just(""), 1 => proptest::sample::select(vec!["[ns]", "[D]"])],
        ) {
            let typestr = format!("{order}{kind}{digits}{unit}");
            let parsed = observed_typestr(parse_typestr(&typestr));
            prop_assert_eq!(parsed, typestr_reference(order, kind, &digits, unit), "{:?}", typestr);
        }
    }
}
