//! The one timestamp format of the workspace: RFC 3339 in UTC with a `Z` suffix, from and to
//! milliseconds since the Unix epoch (what the kill switch signs and the task wire shows); and,
//! for what operators type, RFC 3339 with any UTC offset.

/// Formats milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn format_rfc3339_ms(epoch_ms: i64) -> String {
    let days = epoch_ms.div_euclid(86_400_000);
    let in_day = epoch_ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let hour = in_day / 3_600_000;
    let minute = (in_day / 60_000) % 60;
    let second = (in_day / 1000) % 60;
    let milli = in_day % 1000;
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{milli:03}Z")
}

/// Parses `YYYY-MM-DDTHH:MM:SSZ` or `YYYY-MM-DDTHH:MM:SS.f…Z` (1 to 9 fraction digits, truncated
/// to milliseconds). Only UTC (`Z`) is accepted, years 1970–9999; anything else is `None`.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 || bytes.last() != Some(&b'Z') {
        return None;
    }
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let slice = bytes.get(range)?;
        if slice.is_empty() || !slice.iter().all(u8::is_ascii_digit) {
            return None;
        }
        slice.iter().try_fold(0_i64, |total, digit| total.checked_mul(10)?.checked_add(i64::from(digit - b'0')))
    };
    let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if separators.iter().any(|(index, expected)| bytes.get(*index) != Some(expected)) {
        return None;
    }
    let year = digits(0..4)?;
    let month = digits(5..7)?;
    let day = digits(8..10)?;
    let hour = digits(11..13)?;
    let minute = digits(14..16)?;
    let second = digits(17..19)?;
    let millis = match bytes.len() {
        20 => 0,
        length => {
            if bytes.get(19) != Some(&b'.') || !(22..=30).contains(&length) {
                return None;
            }
            let fraction = digits(20..length - 1)?;
            let fraction_digits = u32::try_from(length - 21).ok()?;
            if fraction_digits >= 3 {
                fraction / 10_i64.pow(fraction_digits - 3)
            } else {
                fraction * 10_i64.pow(3 - fraction_digits)
            }
        }
    };
    if year < 1970 || !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * 86_400_000 + hour * 3_600_000 + minute * 60_000 + second * 1000 + millis)
}

/// Parses RFC 3339 as an operator may type it: [`parse_rfc3339_ms`]'s form, or the same with a
/// lowercase `z` or a numeric offset `±HH:MM` (at most ±23:59) instead of `Z`, as UTC
/// milliseconds. `None` for anything else, or a time before the epoch.
pub fn parse_rfc3339_any_offset_ms(text: &str) -> Option<i64> {
    if let Some(utc) = text.strip_suffix('z') {
        return parse_rfc3339_ms(&format!("{utc}Z"));
    }
    if text.ends_with('Z') {
        return parse_rfc3339_ms(text);
    }
    let split = text.len().checked_sub(6).filter(|split| text.is_char_boundary(*split))?;
    let (local, offset) = text.split_at(split);
    let bytes = offset.as_bytes();
    let sign = match bytes[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    if bytes[3] != b':' || ![1, 2, 4, 5].iter().all(|index| bytes[*index].is_ascii_digit()) {
        return None;
    }
    let number = |at: usize| i64::from(bytes[at] - b'0') * 10 + i64::from(bytes[at + 1] - b'0');
    let (hours, minutes) = (number(1), number(4));
    if hours > 23 || minutes > 59 {
        return None;
    }
    let at = parse_rfc3339_ms(&format!("{local}Z"))? - sign * (hours * 3_600_000 + minutes * 60_000);
    (at >= 0).then_some(at)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let shifted_month = (month + 9) % 12;
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_known_values() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("2000-03-01T00:00:00.5Z"), Some(951_868_800_500));
        assert_eq!(parse_rfc3339_ms("2024-02-29T23:59:59.123456Z"), Some(1_709_251_199_123));
        for sample in [0_i64, 951_868_800_500, 1_709_251_199_123, 4_102_444_800_000, 253_402_300_799_999] {
            assert_eq!(parse_rfc3339_ms(&format_rfc3339_ms(sample)), Some(sample));
        }
    }

    #[test]
    fn offsets_are_converted_to_utc() {
        let utc = parse_rfc3339_ms("2026-12-07T01:30:00Z");
        assert!(utc.is_some());
        for same in [
            "2026-12-07T01:30:00Z",
            "2026-12-07T01:30:00z",
            "2026-12-07T03:30:00+02:00",
            "2026-12-06T20:00:00-05:30",
            "2026-12-07T01:30:00+00:00",
        ] {
            assert_eq!(parse_rfc3339_any_offset_ms(same), utc, "{same}");
        }
        for bad in [
            "2026-12-07T01:30:00+24:00",
            "2026-12-07T01:30:00+0200",
            "2026-12-07T01:30:00",
            "1970-01-01T00:00:00+01:00",
            "2026-12-07T01:30:00+02:60",
            "é",
        ] {
            assert_eq!(parse_rfc3339_any_offset_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn formats_utc_with_milliseconds() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339_ms(1_764_374_400_123), "2025-11-29T00:00:00.123Z");
        assert_eq!(format_rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_rfc3339_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn refuses_other_shapes() {
        for bad in [
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00+00:00",
            "2024-01-01 00:00:00Z",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00",
            "1969-12-31T23:59:59Z",
            "+024-01-01T00:00:00Z",
            "",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
