//! Sizes with units: `64M`, `2G`, `4096`, `1.5G`.

use crate::error::{Error, Result};

/// Parses a size: a number with an optional K/M/G/T suffix (binary units,
/// optional trailing `B` or `iB`).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let bad = || Error::Core(cxlkv_core::Error::InvalidArgument);
    if let Ok(v) = num.parse::<u64>() {
        return v.checked_mul(mul).ok_or_else(bad);
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    if !(f.is_finite() && f >= 0.0) || f * mul as f64 > u64::MAX as f64 {
        return Err(bad());
    }
    Ok((f * mul as f64) as u64)
}

/// Formats bytes with a binary unit.
pub fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("x").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
