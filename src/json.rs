//! JSON written by hand where it is on every review's path (the answer, its patch, the audit line):
//! serde_json looks at every byte of every string, keys included, to escape it, where a uid, a
//! pod's name and a denial's message need nothing escaped. Each writer is held byte for byte to
//! what serde_json writes by a test beside it.

/// `text` as a JSON string: as it is when nothing in it needs escaping (checked in one pass
/// without branches), else escaped by serde_json.
pub fn string(out: &mut Vec<u8>, text: &str) {
    let plain = text.bytes().fold(true, |plain, byte| plain & (byte >= 0x20) & (byte != b'"') & (byte != b'\\'));
    if plain {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, text).expect("a string always serializes");
    }
}

/// `texts` as a JSON array of strings.
pub fn strings(out: &mut Vec<u8>, texts: &[String]) {
    out.push(b'[');
    for (i, text) in texts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, text);
    }
    out.push(b']');
}

/// A JSON Patch: its operations' names, pointers and string values written as [`string`]s,
/// other values by serde_json.
pub fn patch(out: &mut Vec<u8>, patch: &json_patch::Patch) {
    use json_patch::PatchOperation as Op;
    out.push(b'[');
    for (i, operation) in patch.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let (name, from, path, value) = match operation {
            Op::Add(add) => ("add", None, &add.path, Some(&add.value)),
            Op::Remove(remove) => ("remove", None, &remove.path, None),
            Op::Replace(replace) => ("replace", None, &replace.path, Some(&replace.value)),
            Op::Move(moved) => ("move", Some(&moved.from), &moved.path, None),
            Op::Copy(copy) => ("copy", Some(&copy.from), &copy.path, None),
            Op::Test(test) => ("test", None, &test.path, Some(&test.value)),
        };
        out.extend_from_slice(br#"{"op":"#);
        string(out, name);
        if let Some(from) = from {
            out.extend_from_slice(br#","from":"#);
            string(out, from.as_str());
        }
        out.extend_from_slice(br#","path":"#);
        string(out, path.as_str());
        if let Some(value) = value {
            out.extend_from_slice(br#","value":"#);
            match value {
                serde_json::Value::String(text) => string(out, text),
                value => serde_json::to_writer(&mut *out, value).expect("a JSON value always serializes"),
            }
        }
        out.push(b'}');
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_string_is_written_as_serde_json_writes_it() {
        for text in ["plain", "", "quote \" and backslash \\", "tab\t newline\n \u{1} \u{7f} é ✓"] {
            let mut out = Vec::new();
            super::string(&mut out, text);
            assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(text).unwrap());
        }
    }

    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        for texts in [vec![], vec!["one".to_string()], vec!["a".into(), "b \"c\"".into()]] {
            let mut out = Vec::new();
            super::strings(&mut out, &texts);
            assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&texts).unwrap());
        }
    }

    #[test]
    fn a_patch_is_written_as_serde_json_writes_it() {
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "add", "path": "/metadata/annotations/busyguard.io~1busy-since", "value": "2026-11-25T15:49:42Z"},
            {"op": "add", "path": "/metadata/annotations", "value": {"a": "b \"c\"", "n": 1}},
            {"op": "remove", "path": "/metadata/labels/busyguard.io~1protected"},
            {"op": "replace", "path": "/metadata/labels/x", "value": "tab\t"},
            {"op": "move", "from": "/a", "path": "/b"},
            {"op": "copy", "from": "/a", "path": "/c"},
            {"op": "test", "path": "/metadata/uid", "value": null},
        ]))
        .unwrap();
        for patch in [json_patch::Patch(Vec::new()), patch] {
            let mut out = Vec::new();
            super::patch(&mut out, &patch);
            assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&patch).unwrap());
        }
    }
}
