//! What the JSON floor decodes: the review's uid alone, after the whole body is checked as
//! busyguard checks it (UTF-8 once, then serde_json, which checks the fields it skips).

use serde::de::Error as _;

#[derive(serde::Deserialize)]
struct UidOnly {
    request: UidOnlyRequest,
}

#[derive(serde::Deserialize)]
struct UidOnlyRequest {
    uid: String,
}

/// The review's uid, or why the body is not a review.
pub fn decode_uid(body: &[u8]) -> Result<String, serde_json::Error> {
    let text = std::str::from_utf8(body).map_err(serde_json::Error::custom)?;
    Ok(serde_json::from_str::<UidOnly>(text)?.request.uid)
}
