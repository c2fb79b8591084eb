//! Delta debugging of a failing input: drops chunks of lines, then of
//! tokens, then of characters, keeping each cut after which the input still fails the same
//! way, until nothing more can go or the time budget is spent.

use std::time::{Duration, Instant};

fn ddmin<T: Clone>(
    items: Vec<T>,
    join: &dyn Fn(&[T]) -> String,
    fails: &mut dyn FnMut(&str) -> bool,
    deadline: Instant,
) -> Vec<T> {
    let mut items = items;
    let mut chunk = items.len().div_ceil(2).max(1);
    loop {
        let mut removed = false;
        let mut at = 0;
        while at < items.len() {
            if Instant::now() > deadline {
                return items;
            }
            let end = (at + chunk).min(items.len());
            let mut candidate = items[..at].to_vec();
            candidate.extend_from_slice(&items[end..]);
            if !candidate.is_empty() && fails(&join(&candidate)) {
                items = candidate;
                removed = true;
            } else {
                at = end;
            }
        }
        if chunk == 1 && !removed {
            return items;
        }
        if !removed {
            chunk = (chunk / 2).max(1);
        }
    }
}

/// The smallest input found within `budget` for which `fails` holds
/// (`fails(text)` must hold).
pub fn minimize(text: &str, fails: &mut dyn FnMut(&str) -> bool, budget: Duration) -> String {
    let deadline = Instant::now() + budget;
    let lines: Vec<String> = tessera::syntax::lines::lines(text)
        .map(|l| format!("{l}\n"))
        .collect();
    let lines = ddmin(lines, &|ls: &[String]| ls.concat(), fails, deadline);
    let text = lines.concat();
    let pieces = super::mutate::pieces(&text);
    let pieces = ddmin(pieces, &|ps: &[String]| ps.concat(), fails, deadline);
    let text = pieces.concat();
    if text.len() > 4000 {
        return text;
    }
    let chars: Vec<char> = text.chars().collect();
    let chars = ddmin(chars, &|cs: &[char]| cs.iter().collect(), fails, deadline);
    chars.into_iter().collect()
}
