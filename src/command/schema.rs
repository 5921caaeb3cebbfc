//! `summon schema pipeline|recipe|agent`: print a file kind's JSON Schema, the one committed
//! as `schemas/KIND.json`.

use super::Ctx;
use crate::cli::{SchemaArgs, SchemaFile};
use crate::error::Result;
use crate::schema::SchemaKind;

pub(crate) fn run(args: &SchemaArgs, ctx: &mut Ctx) -> Result<()> {
    let kind = match args.kind {
        SchemaFile::Pipeline => SchemaKind::Pipeline,
        SchemaFile::Recipe => SchemaKind::Recipe,
        SchemaFile::Agent => SchemaKind::Agent,
    };
    ctx.out.write(&kind.text())?;
    Ok(())
}
