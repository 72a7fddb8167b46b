//! A fact of a target profile that may be unknown: its value, or the JSON string `"unknown"`
//! (never a guess).

use serde::{Deserialize, Serialize};

/// The marker of an unknown fact: the JSON string `"unknown"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unknown {
    #[serde(rename = "unknown")]
    Unknown,
}

/// A fact that may be unknown: its value, or the string `"unknown"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Fact<T> {
    // First, so that the string "unknown" is never read as a known string.
    Unknown(Unknown),
    Known(T),
}

impl<T> Fact<T> {
    /// The value, when known.
    pub fn known(&self) -> Option<&T> {
        match self {
            Fact::Known(v) => Some(v),
            Fact::Unknown(_) => None,
        }
    }
}

impl<T> Fact<T> {
    /// The value as `show` renders it, or `unknown`.
    pub fn show_with(&self, show: impl Fn(&T) -> String) -> String {
        self.known().map_or_else(|| "unknown".to_string(), show)
    }
}

impl<T: std::fmt::Display> Fact<T> {
    /// The value, or `unknown`.
    pub fn show(&self) -> String {
        self.known()
            .map_or_else(|| "unknown".to_string(), ToString::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_is_a_marker_not_a_value() {
        let f: Fact<String> = serde_json::from_str("\"unknown\"").unwrap();
        assert_eq!(f.known(), None);
        let f: Fact<String> = serde_json::from_str("\"Deepseek\"").unwrap();
        assert_eq!(f.known().map(String::as_str), Some("Deepseek"));
        let f: Fact<usize> = serde_json::from_str("61").unwrap();
        assert_eq!(f.show(), "61");
        assert!(serde_json::from_str::<Fact<usize>>("\"61\"").is_err());
        assert_eq!(
            serde_json::to_string(&Fact::<usize>::Unknown(Unknown::Unknown)).unwrap(),
            "\"unknown\""
        );
    }
}
