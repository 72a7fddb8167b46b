//! How raw text is sent (`--text-mode`): a chat benchmark's text as one user message, other
//! text as it is, or every text one way.

use super::prompt::{user, Body, LivePrompt};

/// How raw text is sent (`verify --text-mode`; `scripts/vllm_capture.py --text-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TextMode {
    /// A chat benchmark's text as a user message through the chat template, other text as is.
    Auto,
    /// Every text as a user message through the chat template.
    Chat,
    /// Every text as it is (completions, no chat template).
    Raw,
}

/// Whether `dataset` names a benchmark whose prompts are chat turns (MT-Bench, Spec-Bench,
/// SPEED-Bench, GSM8K, MATH-500; not HumanEval, whose prompts are code to continue).
pub fn is_chat_dataset(dataset: &str) -> bool {
    let k: String = dataset
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    matches!(
        k.as_str(),
        "mtbench" | "specbench" | "speedbench" | "gsm8k" | "math500"
    )
}

/// Send each prompt's raw text the way `mode` says: as one user message (the server applies
/// the target's chat template, as the capture script does) or as it is. Token ids and chat
/// messages are left as they are. Returns how many prompts went to chat.
pub fn apply_text_mode(prompts: &mut [LivePrompt], mode: TextMode) -> usize {
    let mut n = 0;
    for p in prompts {
        let chat = match mode {
            TextMode::Raw => false,
            TextMode::Chat => true,
            TextMode::Auto => is_chat_dataset(&p.dataset),
        };
        if let (true, Body::Text(t)) = (chat, &p.body) {
            p.body = user(t);
            n += 1;
        }
    }
    n
}
