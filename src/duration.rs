//! Durations as people write them, and times kept to the second.

use jiff::{SignedDuration, Timestamp};

/// Go-style (`1h30m`), friendly (`2 hours`) or ISO 8601 (`PT2H`) durations, above zero.
pub fn parse_positive_duration(text: &str) -> Result<SignedDuration, String> {
    let duration: SignedDuration =
        text.trim().parse().map_err(|_| format!("{text:?} is not a duration such as 90s, 30m, 2h or PT2H"))?;
    if duration.is_positive() { Ok(duration) } else { Err(format!("{text:?} must be longer than zero")) }
}

/// Busy-since and delete-requested times are kept to the second.
pub fn whole_second(now: Timestamp) -> Timestamp {
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_go_style_and_iso() {
        assert_eq!(parse_positive_duration("1h30m"), Ok(SignedDuration::from_mins(90)));
        assert_eq!(parse_positive_duration("PT2H"), Ok(SignedDuration::from_hours(2)));
        assert_eq!(parse_positive_duration("45s"), Ok(SignedDuration::from_secs(45)));
        assert!(parse_positive_duration("0s").is_err());
        assert_eq!(
            parse_positive_duration("forever"),
            Err("\"forever\" is not a duration such as 90s, 30m, 2h or PT2H".into()),
            "one sentence, without the parser's own"
        );
    }

    #[test]
    fn whole_second_drops_the_fraction() {
        let t: Timestamp = "2026-11-21T20:48:44.731Z".parse().unwrap();
        assert_eq!(whole_second(t), "2026-11-21T20:48:44Z".parse::<Timestamp>().unwrap());
    }
}
