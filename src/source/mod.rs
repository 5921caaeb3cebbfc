//! Sources: where recipes and agents are found, and the catalog of them by name.

mod catalog;
mod discover;
mod frozen;
mod search_path;

pub(crate) use catalog::{Catalog, Source, SourceDef, SourceKind};
pub(crate) use discover::{discover, read_source_text};
pub(crate) use frozen::{freeze, thaw};
pub(crate) use search_path::{Scope, search_dirs};
