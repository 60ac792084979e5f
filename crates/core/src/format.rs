//! The format layer's types that callers of the library name: the model of a volume
//! ([`Mapping`], a stack of dm tables of [`TableLine`]s) that table inputs and every header
//! produce and [`crate::mapping::open_mapping`] opens, the checks of a table line, the
//! size syntax of the options, and the progress reports of a TCRYPT header search. They
//! are the library's own vocabulary, so they are re-exported as they are.

pub use ucrypt_format::size::parse_size;
pub use ucrypt_format::tcrypt::{SearchProgress, SearchStep};
pub use ucrypt_format::{FormatError, Mapping, TableLine, ValidateOptions};
