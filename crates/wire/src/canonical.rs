//! Canonical JSON bytes (object keys sorted, no insignificant white space) for digests that must
//! not depend on the order a client happened to write its keys in.

use serde_json::Value;

/// Writes `value` with object keys in byte order, recursively, and no white space.
pub fn canonical_bytes(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (index, key) in keys.into_iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(key.clone()), out);
                out.push(b':');
                write_value(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    // Serialising a scalar `Value` into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"null");
    }
}

#[cfg(test)]
mod tests {
    use super::canonical_bytes;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_the_bytes() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,"x"],"x":null}}"#).unwrap();
        let b = json!({"a": {"x": null, "y": [1, "x"]}, "b": 1});
        assert_eq!(canonical_bytes(&a), canonical_bytes(&b));
        assert_eq!(canonical_bytes(&a), br#"{"a":{"x":null,"y":[1,"x"]},"b":1}"#.to_vec());
    }
}
