//! The safetensors header parser: every length, offset, shape and name in it is hostile until
//! checked. Pure over bytes (no file, no path) so the fuzz target drives it directly.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::dtype::Dtype;
use crate::error::{HeaderError, TensorError};

/// Largest header kquant accepts (the same cap as the `safetensors` crate).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One validated tensor entry. Offsets are relative to the start of the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub start: u64,
    pub end: u64,
}

impl TensorInfo {
    /// Bytes of data.
    pub fn nbytes(&self) -> u64 {
        self.end - self.start
    }
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

/// A validated header: tensors in file order, optional `__metadata__`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The declared JSON length `N` (the data section starts at `8 + N`).
    pub json_len: u64,
    pub tensors: Vec<TensorInfo>,
    pub metadata: Option<BTreeMap<String, String>>,
}

impl Header {
    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        8 + self.json_len
    }
}

/// Read the 8-byte length prefix and check it against the file length. Returns the JSON length.
pub fn read_prefix(prefix: &[u8], file_len: u64) -> Result<u64, HeaderError> {
    let Some(p) = prefix.get(..8) else {
        return Err(HeaderError::TooSmall(file_len));
    };
    let len = u64::from_le_bytes(p.try_into().unwrap());
    if len > MAX_HEADER_LEN {
        return Err(HeaderError::TooLarge {
            len,
            cap: MAX_HEADER_LEN,
        });
    }
    if len.checked_add(8).is_none_or(|end| end > file_len) {
        return Err(HeaderError::PastEof { len, file_len });
    }
    Ok(len)
}

/// Parse and fully validate a whole safetensors file held in memory (or mapped).
pub fn parse(file: &[u8]) -> Result<Header, HeaderError> {
    let file_len = file.len() as u64;
    let json_len = read_prefix(file, file_len)?;
    let json = &file[8..8 + json_len as usize];
    let data_len = file_len - 8 - json_len;
    parse_json(json, json_len, data_len)
}

/// Validate the JSON part of a header against a data section of `data_len` bytes.
pub fn parse_json(json: &[u8], json_len: u64, data_len: u64) -> Result<Header, HeaderError> {
    let first = json.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(match serde_json::from_slice::<Value>(json) {
            Ok(_) => HeaderError::NotObject,
            Err(e) => HeaderError::Json(e.to_string()),
        });
    }
    let entries = ordered_entries(json).map_err(|e| HeaderError::Json(e.to_string()))?;

    let mut tensors = Vec::with_capacity(entries.len());
    let mut metadata = None;
    let mut seen = std::collections::HashSet::new();
    for (name, value) in entries {
        if !seen.insert(name.clone()) {
            return Err(HeaderError::DuplicateTensor(name));
        }
        if name == "__metadata__" {
            metadata = Some(parse_metadata(value)?);
            continue;
        }
        let info = parse_entry(&name, &value).map_err(|kind| HeaderError::Tensor {
            name: name.clone(),
            kind,
        })?;
        if info.end > data_len {
            return Err(HeaderError::Tensor {
                name,
                kind: TensorError::OutOfBounds {
                    end: info.end,
                    data_len,
                },
            });
        }
        tensors.push(info);
    }
    check_tiling(&tensors, data_len)?;
    Ok(Header {
        json_len,
        tensors,
        metadata,
    })
}

fn parse_metadata(v: Value) -> Result<BTreeMap<String, String>, HeaderError> {
    let Value::Object(m) = v else {
        return Err(HeaderError::BadMetadata);
    };
    m.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(HeaderError::BadMetadata),
        })
        .collect()
}

fn parse_entry(name: &str, v: &Value) -> Result<TensorInfo, TensorError> {
    let bad = || TensorError::BadEntry(truncate(&v.to_string()));
    let obj = v.as_object().ok_or_else(bad)?;
    let dtype_s = obj.get("dtype").and_then(Value::as_str).ok_or_else(bad)?;
    let dtype =
        Dtype::parse(dtype_s).ok_or_else(|| TensorError::UnknownDtype(dtype_s.to_string()))?;
    let shape_v = obj.get("shape").and_then(Value::as_array).ok_or_else(bad)?;
    let shape_s = || truncate(&Value::Array(shape_v.clone()).to_string());
    let shape: Vec<usize> = shape_v
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<_>>()
        .ok_or_else(|| TensorError::BadShape(shape_s()))?;
    let offs = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    let offs_s = || truncate(&Value::Array(offs.clone()).to_string());
    let (start, end) = match offs.as_slice() {
        [a, b] => match (a.as_u64(), b.as_u64()) {
            (Some(a), Some(b)) if a <= b => (a, b),
            _ => return Err(TensorError::BadOffsets(offs_s())),
        },
        _ => return Err(TensorError::BadOffsets(offs_s())),
    };
    let expected = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| TensorError::ShapeOverflow(shape_s()))?;
    if expected != end - start {
        return Err(TensorError::SizeMismatch {
            dtype: dtype.name().into(),
            shape: shape_s(),
            expected,
            actual: end - start,
        });
    }
    Ok(TensorInfo {
        name: name.to_string(),
        dtype,
        shape,
        start,
        end,
    })
}

/// Offsets must tile the data section exactly: no overlaps, no gaps, no trailing bytes.
fn check_tiling(tensors: &[TensorInfo], data_len: u64) -> Result<(), HeaderError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| (t.start, t.end));
    let mut pos = 0u64;
    let mut prev: Option<&TensorInfo> = None;
    for t in order {
        if t.start < pos {
            let other = prev.map(|p| p.name.clone()).unwrap_or_default();
            return Err(HeaderError::Tensor {
                name: t.name.clone(),
                kind: TensorError::Overlap {
                    start: t.start,
                    end: t.end,
                    other,
                },
            });
        }
        if t.start > pos {
            return Err(HeaderError::Gap {
                start: pos,
                end: t.start,
            });
        }
        pos = t.end;
        prev = Some(t);
    }
    if pos != data_len {
        return Err(HeaderError::Gap {
            start: pos,
            end: data_len,
        });
    }
    Ok(())
}

fn truncate(s: &str) -> String {
    if s.len() <= 80 {
        s.to_string()
    } else {
        let mut end = 80;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    }
}

/// Parse a JSON object into its entries in file order, keeping duplicate keys so callers can
/// refuse them (serde_json's own map silently keeps the last). Inside each entry's value a
/// repeated key is an error: `{"dtype":"U8","dtype":"F32",…}` would otherwise be read as its
/// last `dtype` here and refused (or read as its first) by other readers.
pub(crate) fn ordered_entries(json: &[u8]) -> serde_json::Result<Vec<(String, Value)>> {
    serde_json::from_slice::<Entries>(json).map(|e| e.0)
}

pub(crate) struct Entries(pub(crate) Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Entries, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, UniqueKeys>()? {
                    v.push((k, val.0));
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// A JSON value whose objects, at any depth, have no repeated key.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UniqueKeys;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, b: bool) -> Result<UniqueKeys, E> {
                Ok(UniqueKeys(Value::Bool(b)))
            }
            fn visit_i64<E>(self, n: i64) -> Result<UniqueKeys, E> {
                Ok(UniqueKeys(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<UniqueKeys, E> {
                Ok(UniqueKeys(n.into()))
            }
            fn visit_f64<E>(self, n: f64) -> Result<UniqueKeys, E> {
                Ok(UniqueKeys(n.into()))
            }
            fn visit_str<E>(self, s: &str) -> Result<UniqueKeys, E> {
                Ok(UniqueKeys(Value::String(s.into())))
            }
            fn visit_string<E>(self, s: String) -> Result<UniqueKeys, E> {
                Ok(UniqueKeys(Value::String(s)))
            }
            fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
                Ok(UniqueKeys(Value::Null))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<UniqueKeys, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = s.next_element::<UniqueKeys>()? {
                    v.push(e.0);
                }
                Ok(UniqueKeys(Value::Array(v)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<UniqueKeys, A::Error> {
                let mut o = serde_json::Map::new();
                while let Some(k) = m.next_key::<String>()? {
                    if o.contains_key(&k) {
                        return Err(de::Error::custom(format_args!("duplicate key `{k}`")));
                    }
                    let v = m.next_value::<UniqueKeys>()?;
                    o.insert(k, v.0);
                }
                Ok(UniqueKeys(Value::Object(o)))
            }
        }
        d.deserialize_any(V)
    }
}

/// Serialize a header for the given tensors (already laid out) and metadata, padded with
/// spaces so the data section starts 8-byte aligned, as the `safetensors` library does.
pub fn serialize(tensors: &[TensorInfo], metadata: Option<&BTreeMap<String, String>>) -> Vec<u8> {
    let mut obj = serde_json::Map::new();
    if let Some(m) = metadata {
        obj.insert(
            "__metadata__".into(),
            Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect(),
            ),
        );
    }
    for t in tensors {
        obj.insert(
            t.name.clone(),
            serde_json::json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [t.start, t.end]}),
        );
    }
    let mut json = serde_json::to_vec(&Value::Object(obj)).expect("header JSON");
    let pad = (8 - (json.len() % 8)) % 8;
    json.extend(std::iter::repeat_n(b' ', pad));
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str, data: &[u8]) -> Vec<u8> {
        let mut f = (json.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(json.as_bytes());
        f.extend_from_slice(data);
        f
    }

    /// What is wrong with the one tensor `parse` refuses in a file of header `json`.
    fn tensor_error(json: &str, data: &[u8]) -> TensorError {
        match parse(&file(json, data)) {
            Err(HeaderError::Tensor { kind, .. }) => kind,
            other => panic!("{json}: {:?}", other.err().map(|e| e.to_string())),
        }
    }

    #[test]
    fn valid_round_trip() {
        let t = vec![
            TensorInfo {
                name: "a".into(),
                dtype: Dtype::BF16,
                shape: vec![2, 2],
                start: 0,
                end: 8,
            },
            TensorInfo {
                name: "b".into(),
                dtype: Dtype::I64,
                shape: vec![1],
                start: 8,
                end: 16,
            },
        ];
        let mut f = serialize(&t, None);
        f.extend_from_slice(&[0u8; 16]);
        let h = parse(&f).unwrap();
        assert_eq!(h.tensors, t);
        assert_eq!(h.data_offset() % 8, 0);
    }

    #[test]
    fn each_failure_has_its_variant() {
        assert_eq!(parse(&[1, 2, 3]), Err(HeaderError::TooSmall(3)));
        let mut f = u64::MAX.to_le_bytes().to_vec();
        f.push(b'{');
        assert!(matches!(parse(&f), Err(HeaderError::TooLarge { .. })));
        let mut f = 100u64.to_le_bytes().to_vec();
        f.extend_from_slice(b"{}");
        assert!(matches!(parse(&f), Err(HeaderError::PastEof { .. })));
        assert!(matches!(
            parse(&file("{nope", &[])),
            Err(HeaderError::Json(_))
        ));
        assert!(matches!(
            parse(&file("[1]", &[])),
            Err(HeaderError::NotObject)
        ));
        // Each tensor refused, by what is wrong with it.
        for (json, data, want) in [
            (
                r#"{"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}"#,
                &[0][..],
                "UnknownDtype",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
                &[0][..],
                "BadShape",
            ),
            (
                r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,1]}}"#,
                &[0][..],
                "ShapeOverflow",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}}"#,
                &[0][..],
                "SizeMismatch",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
                &[0][..],
                "OutOfBounds",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#,
                &[0; 3][..],
                "Overlap",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[2,1]}}"#,
                &[0][..],
                "BadOffsets",
            ),
        ] {
            let kind = format!("{:?}", tensor_error(json, data));
            assert!(kind.starts_with(want), "{json}: {kind}");
        }
        assert!(matches!(
            parse(&file(
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
                &[0; 2]
            )),
            Err(HeaderError::Gap { start: 0, end: 1 })
        ));
        assert!(matches!(
            parse(&file(
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
                &[0; 2]
            )),
            Err(HeaderError::Gap { start: 1, end: 2 })
        ));
        assert!(matches!(
            parse(&file(
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
                &[0]
            )),
            Err(HeaderError::DuplicateTensor(_))
        ));
        assert!(matches!(
            parse(&file(r#"{"__metadata__":{"a":1}}"#, &[])),
            Err(HeaderError::BadMetadata)
        ));
    }
}
