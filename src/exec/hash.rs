//! The content hash of a rendered task: what decides whether a journaled result can be
//! reused on `--resume`.

use sha2::{Digest, Sha256};

/// Hashes the parts of a request in order, each length-prefixed so that no two different
/// requests collide by concatenation.
pub(crate) fn request_hash(parts: &[Option<&str>]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        match part {
            Some(text) => {
                hasher.update([1u8]);
                hasher.update((text.len() as u64).to_le_bytes());
                hasher.update(text.as_bytes());
            }
            None => hasher.update([0u8]),
        }
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_do_not_run_together() {
        assert_ne!(
            request_hash(&[Some("ab"), Some("c")]),
            request_hash(&[Some("a"), Some("bc")])
        );
        assert_ne!(
            request_hash(&[None, Some("x")]),
            request_hash(&[Some(""), Some("x")])
        );
        assert_eq!(request_hash(&[Some("a")]), request_hash(&[Some("a")]));
    }
}
