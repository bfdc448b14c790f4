//! Durations as people write them, and times kept to the second.

use jiff::civil::DateTime;
use jiff::tz::Offset;
use jiff::{SignedDuration, Timestamp};
use serde::Deserializer;
use serde::de::{Error, Visitor};

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

/// A time as the API server writes every pod time, RFC 3339 to the second in UTC
/// (`2026-11-25T13:22:53Z`), read in about 290 instructions instead of the general parser's 550
/// (a pod review reads about eight): the digits picked out by position, the date checked and
/// counted by jiff. Any other form goes to the general parser.
pub fn parse_time(text: &str) -> Result<Timestamp, jiff::Error> {
    api_form(text.as_bytes()).map_or_else(|| text.parse(), Ok)
}

fn api_form(text: &[u8]) -> Option<Timestamp> {
    let [y0, y1, y2, y3, b'-', m0, m1, b'-', d0, d1, b'T', h0, h1, b':', i0, i1, b':', s0, s1, b'Z'] = *text else {
        return None;
    };
    let number = |digits: &[u8]| {
        digits.iter().try_fold(0i16, |n, &digit| digit.is_ascii_digit().then(|| n * 10 + i16::from(digit - b'0')))
    };
    // Two digits fit an i8; jiff checks the ranges (a 30 February is no date).
    let two = |digits: [u8; 2]| number(&digits).map(|n| n as i8);
    let time = DateTime::new(
        number(&[y0, y1, y2, y3])?,
        two([m0, m1])?,
        two([d0, d1])?,
        two([h0, h1])?,
        two([i0, i1])?,
        two([s0, s1])?,
        0,
    );
    Offset::UTC.to_timestamp(time.ok()?).ok()
}

/// For `#[serde(deserialize_with)]` on an `Option<Timestamp>` of a pod: null or absent is
/// `None`, a string is read by [`parse_time`].
pub fn api_time<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Timestamp>, D::Error> {
    struct Time;
    impl<'de> Visitor<'de> for Time {
        type Value = Option<Timestamp>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a time such as 2026-11-25T13:22:53Z")
        }

        fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_str(self)
        }

        fn visit_str<E: Error>(self, text: &str) -> Result<Self::Value, E> {
            parse_time(text).map(Some).map_err(E::custom)
        }
    }
    deserializer.deserialize_option(Time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_servers_times_read_as_the_general_parser_reads_them() {
        for text in [
            "1970-01-01T00:00:00Z",
            "2026-11-25T13:22:53Z",
            "2024-02-29T23:59:59Z",
            "2000-02-29T12:00:00Z",
            "1969-12-31T23:59:59Z",
            "0001-01-01T00:00:00Z",
            "9999-12-30T21:59:59Z",
            "2026-03-01T00:00:00Z",
        ] {
            assert_eq!(api_form(text.as_bytes()), Some(text.parse().unwrap()), "{text}");
        }
    }

    #[test]
    fn other_forms_go_to_the_general_parser_and_nonsense_is_an_error() {
        for (text, read) in [
            ("2026-11-25T13:22:53.5Z", "2026-11-25T13:22:53.5Z"),
            ("2026-11-25T14:22:53+01:00", "2026-11-25T13:22:53Z"),
            ("2026-11-25t13:22:53z", "2026-11-25T13:22:53Z"),
        ] {
            assert_eq!(api_form(text.as_bytes()), None, "{text}");
            assert_eq!(parse_time(text).unwrap(), read.parse::<Timestamp>().unwrap(), "{text}");
        }
        for nonsense in
            ["2023-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-11-25T24:00:00Z", "2026-11-2xT13:22:53Z", ""]
        {
            assert_eq!(api_form(nonsense.as_bytes()), None, "{nonsense}");
            assert!(parse_time(nonsense).is_err(), "{nonsense}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_second_from_year_1_to_9999_reads_as_the_general_parser_reads_it(second in -62_135_596_800i64..Timestamp::MAX.as_second()) {
            let time = Timestamp::from_second(second).unwrap();
            let text = time.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
            proptest::prop_assert_eq!(api_form(text.as_bytes()), Some(time));
        }
    }

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
