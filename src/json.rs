//! JSON written by hand where it is on every review's path (the answer, the audit line):
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
}
