//! Memory sizes written the way people write them: `2GiB`, `512MiB`,
//! `1.5GB`, `100000`.

use crate::{Error, Result};

/// Parses a size in bytes: a number (decimals allowed) and an optional
/// unit: `B`, `KiB`/`K`, `MiB`/`M`, `GiB`/`G` (powers of 1024) or `KB`,
/// `MB`, `GB` (powers of 1000), case-insensitive.
///
/// For command lines that take a [`MemoryBudget`](super::MemoryBudget) or a memory
/// limit.
///
/// # Errors
/// [`Error::InvalidArgument`] with a one-line message for anything else,
/// and for sizes below one byte.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| Error::InvalidArgument(format!("`{s}` is not a size such as 2GiB or 512MiB")))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        other => {
            return Err(Error::InvalidArgument(format!(
                "unknown size unit `{other}` (use B, KiB, MiB, GiB, KB, MB or GB)"
            )));
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(Error::InvalidArgument(format!("`{s}` is not a usable size")));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use crate::llama::plan::{HOST, MemoryBudget};

    #[test]
    fn budgets_parse_from_name_size_pairs() {
        let parsed: MemoryBudget = "CUDA0=2GiB, Host=1.5GB,total=4GiB".parse().unwrap();
        assert_eq!(parsed, MemoryBudget::total(4 << 30).device("CUDA0", 2 << 30).device(HOST, 1_500_000_000));
        // A later limit on the same device replaces the earlier.
        assert_eq!("RPC0=1M,RPC0=2M".parse::<MemoryBudget>().unwrap(), MemoryBudget::default().device("RPC0", 2 << 20));
        for bad in ["", "CUDA0", "=2GiB", "CUDA0=lots", "CUDA0=2GiB,"] {
            match bad.parse::<MemoryBudget>() {
                Err(crate::Error::InvalidArgument(message)) => assert!(!message.is_empty()),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    use super::parse_size;

    #[test]
    fn sizes_parse_in_both_unit_systems() {
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("512mib").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size(" 100000 ").unwrap(), 100_000);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("2 TiB").unwrap_err().to_string().contains("unit `tib`"));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1e30GiB").is_err());
    }
}
