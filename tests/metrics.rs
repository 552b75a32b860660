//! Placeholder; filled in by its issue's work.
