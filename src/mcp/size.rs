//! Sizes in words people read: "512 bytes", "100 KiB", "9.5 MiB".

/// `bytes` in the largest binary unit that keeps it at least 1.
pub(crate) fn human(bytes: usize) -> String {
    const KIB: f64 = 1024.0;
    #[allow(clippy::cast_precision_loss)]
    let n = bytes as f64;
    if n < KIB {
        format!("{bytes} bytes")
    } else if n < KIB * KIB {
        trimmed(n / KIB, "KiB")
    } else if n < KIB * KIB * KIB {
        trimmed(n / KIB / KIB, "MiB")
    } else {
        trimmed(n / KIB / KIB / KIB, "GiB")
    }
}

/// One decimal, dropped when it is zero.
fn trimmed(value: f64, unit: &str) -> String {
    let text = format!("{value:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text} {unit}")
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn units() {
        assert_eq!(human(12), "12 bytes");
        assert_eq!(human(100 * 1024), "100 KiB");
        assert_eq!(human(10_000_000), "9.5 MiB");
        assert_eq!(human(64 * 1024 * 1024), "64 MiB");
    }
}
