//! The lowering's name environment: one map changed in place, with an undo
//! log while a branch or loop body is open, so entering and leaving one costs
//! what it changed rather than a copy of every name in scope.

use std::collections::HashMap;
use std::ops::Index;

/// Names to values, with nested undo frames.
#[derive(Debug)]
pub(super) struct ScopedEnv<V> {
    map: HashMap<String, V>,
    /// `(name, value before)` for every change made while a frame is open.
    log: Vec<(String, Option<V>)>,
    open: usize,
}

/// An open undo frame: where its changes start in the log.
#[must_use]
pub(super) struct Frame(usize);

impl<V: Clone> ScopedEnv<V> {
    pub fn new() -> Self {
        ScopedEnv {
            map: HashMap::new(),
            log: Vec::new(),
            open: 0,
        }
    }

    pub fn get(&self, name: &str) -> Option<&V> {
        self.map.get(name)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub fn insert(&mut self, name: String, v: V) {
        let old = self.map.insert(name.clone(), v);
        if self.open > 0 {
            self.log.push((name, old));
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<V> {
        let old = self.map.remove(name)?;
        if self.open > 0 {
            self.log.push((name.to_string(), Some(old.clone())));
        }
        Some(old)
    }

    /// Opens a frame: changes from here on can be rolled back.
    pub fn open(&mut self) -> Frame {
        self.open += 1;
        Frame(self.log.len())
    }

    /// Undoes the changes made since `frame` was opened and returns the
    /// changed names with the values they had just before (`None`: unbound).
    /// The frame stays open.
    pub fn rollback(&mut self, frame: &Frame) -> HashMap<String, Option<V>> {
        let mut changed = HashMap::new();
        super::lower::work(self.log.len() - frame.0);
        while self.log.len() > frame.0 {
            let Some((name, old)) = self.log.pop() else {
                break;
            };
            let now = match old {
                Some(v) => self.map.insert(name.clone(), v),
                None => self.map.remove(&name),
            };
            // The latest change is popped first; it holds the value the
            // rolled-back code left.
            changed.entry(name).or_insert(now);
        }
        changed
    }

    /// Closes `frame`, keeping its changes (an enclosing frame can still
    /// undo them).
    pub fn close(&mut self, frame: Frame) {
        debug_assert!(self.open > 0 && self.log.len() >= frame.0);
        self.open -= 1;
        if self.open == 0 {
            self.log.clear();
        }
    }
}

impl<V: Clone> Index<&str> for ScopedEnv<V> {
    type Output = V;
    fn index(&self, name: &str) -> &V {
        &self.map[name]
    }
}
