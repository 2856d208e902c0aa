//! Dotted field path helpers.
