//! A long run's state between slices: `fuzz --resume` continues a run (same
//! seed and job count) where the last slice stopped, so a run that must be
//! cut into pieces (a machine lent for ten minutes at a time, a laptop that
//! sleeps) still covers one stream of inputs, each exactly once, and its
//! totals add up across the slices.
//!
//! The file (`OUT/state`) is plain text, one fact per line:
//!
//! ```text
//! seed 20261201
//! jobs 31
//! slices 2
//! seconds 1103.5
//! next 0 81234          (worker 0's next input index; one line per worker)
//! counts <Counts::encode()>
//! failure new 3 panic in emit at compiler/src/x.rs   (kind, times seen, signature)
//! ```

use std::path::{Path, PathBuf};

use super::exec::Counts;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunState {
    pub seed: u64,
    pub jobs: u64,
    /// Slices run so far.
    pub slices: u64,
    /// Wall-clock seconds of all slices.
    pub seconds: f64,
    /// Per worker, the index of the first input it has not begun.
    pub next: Vec<u64>,
    pub counts: Counts,
    /// Failures seen in all slices: (`new` or `known`, times seen, coarse signature).
    pub failures: Vec<(String, u64, String)>,
}

impl RunState {
    pub fn path(out: &Path) -> PathBuf {
        out.join("state")
    }

    pub fn encode(&self) -> String {
        let mut s = format!(
            "seed {}\njobs {}\nslices {}\nseconds {:.1}\n",
            self.seed, self.jobs, self.slices, self.seconds
        );
        for (w, n) in self.next.iter().enumerate() {
            s.push_str(&format!("next {w} {n}\n"));
        }
        s.push_str(&format!("counts {}\n", self.counts.encode()));
        for (kind, times, sig) in &self.failures {
            s.push_str(&format!("failure {kind} {times} {sig}\n"));
        }
        s
    }

    /// Parses a state file; the error says which line is wrong.
    pub fn decode(text: &str) -> Result<RunState, String> {
        let mut st = RunState::default();
        let mut seen = (false, false, false);
        for (n, line) in text.lines().enumerate() {
            let bad = || format!("line {}: cannot read `{line}`", n + 1);
            let (key, rest) = line.split_once(' ').ok_or_else(bad)?;
            match key {
                "seed" => {
                    st.seed = rest.parse().map_err(|_| bad())?;
                    seen.0 = true;
                }
                "jobs" => {
                    st.jobs = rest.parse().map_err(|_| bad())?;
                    seen.1 = true;
                }
                "slices" => st.slices = rest.parse().map_err(|_| bad())?,
                "seconds" => st.seconds = rest.parse().map_err(|_| bad())?,
                "next" => {
                    let (w, i) = rest.split_once(' ').ok_or_else(bad)?;
                    let w: usize = w.parse().map_err(|_| bad())?;
                    let i: u64 = i.parse().map_err(|_| bad())?;
                    if w != st.next.len() {
                        return Err(bad());
                    }
                    st.next.push(i);
                }
                "counts" => {
                    st.counts = Counts::decode(rest).ok_or_else(bad)?;
                    seen.2 = true;
                }
                "failure" => {
                    let mut p = rest.splitn(3, ' ');
                    let kind = p.next().ok_or_else(bad)?.to_string();
                    let times = p.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
                    let sig = p.next().ok_or_else(bad)?.to_string();
                    st.failures.push((kind, times, sig));
                }
                _ => return Err(bad()),
            }
        }
        if !(seen.0 && seen.1 && seen.2) || st.next.len() as u64 != st.jobs {
            return Err("the state lacks its seed, jobs, counts or a worker's next index".into());
        }
        Ok(st)
    }

    /// Folds one failure (seen `times` times in a slice) into the totals.
    pub fn add_failure(&mut self, kind: &str, times: u64, sig: &str) {
        match self.failures.iter_mut().find(|f| f.2 == sig) {
            Some(f) => f.1 += times,
            None => self
                .failures
                .push((kind.to_string(), times, sig.to_string())),
        }
    }

    pub fn failure_count(&self) -> u64 {
        self.failures.iter().map(|f| f.1).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_back_as_written() {
        let mut st = RunState {
            seed: 7,
            jobs: 2,
            slices: 3,
            seconds: 12.5,
            next: vec![40, 41],
            ..RunState::default()
        };
        st.counts.inputs = 81;
        st.counts.runs = [81, 50, 50, 81];
        st.add_failure("known", 2, "hang in run");
        st.add_failure("known", 1, "hang in run");
        st.add_failure("new", 1, "panic in emit at compiler/src/a.rs");
        let back = RunState::decode(&st.encode()).unwrap();
        assert_eq!(back, st);
        assert_eq!(back.failure_count(), 4);
    }

    #[test]
    fn a_damaged_state_is_refused_with_its_line() {
        let err = RunState::decode("seed 7\njobs two\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        let err = RunState::decode("seed 7\njobs 2\nnext 0 5\ncounts 0 0 0 0 0 0 0 0 0 0 0 0\n")
            .unwrap_err();
        assert!(err.contains("next index"), "{err}");
    }
}
