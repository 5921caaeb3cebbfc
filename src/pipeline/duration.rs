//! Durations as pipelines write them: `90s`, `5m`, `1h30m`, `250ms`, or a bare number of
//! seconds.

use std::time::Duration;

/// Parses a duration; the error says what is accepted.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = || {
        format!(
            "`{text}` is not a duration; write seconds (`90`) or a number with units h, m, s, ms (`90s`, `5m`, `1h30m`)"
        )
    };
    if text.is_empty() {
        return Err(invalid());
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return from_seconds(seconds).ok_or_else(invalid);
    }
    let mut total = 0.0_f64;
    let mut rest = text;
    let mut last_rank = usize::MAX;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(invalid());
        }
        let number: f64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let (rank, scale) = match &rest[..unit_len] {
            "h" => (3, 3600.0),
            "m" => (2, 60.0),
            "s" => (1, 1.0),
            "ms" => (0, 0.001),
            _ => return Err(invalid()),
        };
        // units from largest to smallest, each once: `1h30m`, not `30m1h` or `5m5m`
        if rank >= last_rank {
            return Err(invalid());
        }
        last_rank = rank;
        total += number * scale;
        rest = &rest[unit_len..];
    }
    from_seconds(total).ok_or_else(invalid)
}

/// A positive, finite number of seconds.
pub(crate) fn from_seconds(seconds: f64) -> Option<Duration> {
    (seconds.is_finite() && seconds > 0.0)
        .then(|| Duration::try_from_secs_f64(seconds).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        let cases = [
            ("90", 90_000),
            ("1.5", 1_500),
            ("90s", 90_000),
            ("5m", 300_000),
            ("1h30m", 5_400_000),
            ("1h30m15s", 5_415_000),
            ("250ms", 250),
            ("2m500ms", 120_500),
            (" 1.5h ", 5_400_000),
        ];
        for (text, millis) in cases {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(millis)),
                "{text}"
            );
        }
    }

    #[test]
    fn rejected_forms() {
        for text in [
            "", "0", "0s", "-5", "5x", "m", "5 m", "30m1h", "5m5m", "1h-3m", "inf", "NaN", "1e400",
        ] {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains("not a duration"), "{text}: {err}");
        }
    }
}
