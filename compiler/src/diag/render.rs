//! Terminal (ariadne) and JSON rendering of diagnostics (PLACEHOLDER).
