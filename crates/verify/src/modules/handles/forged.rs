//! The handles checks of made-up handles: a random guess and near misses in the handle's alphabet.

use std::collections::BTreeSet;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::common::*;
use crate::check::{Check, Outcome};
use crate::modules::Context;

/// The alphabet a handle seems drawn from and the bits each character carries.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Alphabet {
    pub(super) chars: Vec<char>,
}

impl Alphabet {
    /// The smallest usual alphabet holding every character of `samples`: hexadecimal (either
    /// case), digits, else the union of the classes present (lower, upper, digits, `-_`, `+/`,
    /// any other character itself).
    pub(super) fn of(samples: &[&str]) -> Self {
        let all: BTreeSet<char> = samples.iter().flat_map(|sample| sample.chars()).collect();
        let range = |from: char, to: char| (from..=to).collect::<Vec<char>>();
        if !all.is_empty() && all.iter().all(char::is_ascii_digit) {
            return Self { chars: range('0', '9') };
        }
        if !all.is_empty() && all.iter().all(|c| c.is_ascii_digit() || ('a'..='f').contains(c)) {
            return Self { chars: [range('0', '9'), range('a', 'f')].concat() };
        }
        if !all.is_empty() && all.iter().all(|c| c.is_ascii_digit() || ('A'..='F').contains(c)) {
            return Self { chars: [range('0', '9'), range('A', 'F')].concat() };
        }
        let mut chars = Vec::new();
        if all.iter().any(char::is_ascii_uppercase) {
            chars.extend(range('A', 'Z'));
        }
        if all.iter().any(char::is_ascii_lowercase) {
            chars.extend(range('a', 'z'));
        }
        if all.iter().any(char::is_ascii_digit) {
            chars.extend(range('0', '9'));
        }
        if all.iter().any(|c| matches!(c, '-' | '_')) {
            chars.extend(['-', '_']);
        }
        if all.iter().any(|c| matches!(c, '+' | '/')) {
            chars.extend(['+', '/']);
        }
        chars.extend(all.iter().filter(|c| !c.is_ascii_alphanumeric() && !matches!(c, '-' | '_' | '+' | '/' | '=')));
        Self { chars }
    }

    /// Another character of the alphabet than `c` (the next one, cyclically).
    pub(super) fn other_than(&self, c: char) -> Option<char> {
        let position = self.chars.iter().position(|known| *known == c).unwrap_or(0);
        let next = self.chars.get((position + 1) % self.chars.len().max(1)).copied()?;
        (next != c).then_some(next)
    }
}

/// The near misses of a handle.
#[derive(Debug, Clone, Copy)]
pub(super) enum NearMiss {
    LastChar,
    FirstChar,
    Truncated,
    Appended,
    CaseFlipped,
}

/// `real` changed by `kind`, staying in its alphabet; `None` when no such change exists.
pub(super) fn near_miss(real: &str, kind: NearMiss) -> Option<String> {
    let alphabet = Alphabet::of(&[real]);
    let mut chars: Vec<char> = real.chars().collect();
    match kind {
        NearMiss::LastChar => {
            let last = chars.last_mut()?;
            *last = alphabet.other_than(*last)?;
        }
        NearMiss::FirstChar => {
            let first = chars.first_mut()?;
            *first = alphabet.other_than(*first)?;
        }
        NearMiss::Truncated => {
            chars.pop()?;
            if chars.is_empty() {
                return None;
            }
        }
        NearMiss::Appended => {
            let last = *chars.last()?;
            chars.push(alphabet.other_than(last).unwrap_or(last));
        }
        NearMiss::CaseFlipped => {
            if !chars.iter().any(char::is_ascii_alphabetic) {
                return None;
            }
            for c in &mut chars {
                *c = if c.is_ascii_uppercase() { c.to_ascii_lowercase() } else { c.to_ascii_uppercase() };
            }
        }
    }
    let forged: String = chars.into_iter().collect();
    (forged != real).then_some(forged)
}

/// A random handle of `real`'s length from its alphabet; `None` when the random source fails.
pub(super) fn random_like(real: &str) -> Option<String> {
    let alphabet = Alphabet::of(&[real]);
    let length = real.chars().count().max(1);
    if alphabet.chars.len() < 2 {
        let mut bytes = [0u8; 32];
        aws_lc_rs::rand::fill(&mut bytes).ok()?;
        return Some(URL_SAFE_NO_PAD.encode(bytes));
    }
    let mut bytes = vec![0u8; length * 2];
    aws_lc_rs::rand::fill(&mut bytes).ok()?;
    let size = alphabet.chars.len();
    let made: String = bytes
        .chunks(2)
        .map(|pair| {
            let index = ((usize::from(pair[0]) << 8) | usize::from(pair.get(1).copied().unwrap_or(0))) % size;
            alphabet.chars[index]
        })
        .collect();
    (made != real).then_some(made)
}

/// The owner's use with the real handle next to the owner's use with `forged` (redacted first).
pub(super) async fn forged_use(
    ctx: &Context,
    check: Check,
    forge: impl Fn(&str) -> Option<String>,
    label: &str,
) -> Outcome {
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let Some(tool) = surface.primary().cloned() else {
        return not_testable(&check, format!("every tool taking `{}` consumes the object", surface.property));
    };
    let Some(forged) = forge(&minted.value) else {
        return not_testable(&check, format!("no {label} of this handle exists (its characters do not allow one)"));
    };
    redact_handle(ctx, &forged, &format!("handle-{label}"), &mut []);
    let control = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    let negative = use_handle(ctx, &surface, &tool, &forged, ctx.auth()).await;
    pair(&check, &[&minted.exchange], &control, &negative)
}

pub(super) async fn forge_random(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, random_like, "guessed").await
}

pub(super) async fn forge_last_char(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::LastChar), "near-miss-last").await
}

pub(super) async fn forge_first_char(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::FirstChar), "near-miss-first").await
}

pub(super) async fn forge_truncated(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::Truncated), "near-miss-truncated").await
}

pub(super) async fn forge_appended(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::Appended), "near-miss-appended").await
}

pub(super) async fn forge_case_flipped(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::CaseFlipped), "near-miss-case").await
}
