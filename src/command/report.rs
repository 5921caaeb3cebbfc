//! `summon report DIR`: builds `DIR/report.html` again from the `results.jsonl` and
//! `report.json` of a run's or a merge's `--out` directory (after an upgrade, or for a
//! directory copied from elsewhere), and prints its path.

use super::Ctx;
use crate::cli::ReportArgs;
use crate::error::{Error, Result};
use crate::output::{HTML_FILE, write_html};

pub(crate) fn run(args: &ReportArgs, ctx: &mut Ctx) -> Result<()> {
    let dir = ctx.env.cwd.join(&args.dir);
    let shown = args.dir.display();
    if !dir.is_dir() {
        return Err(Error::usage(format!(
            "`{shown}` is not a directory; give the `--out` directory of a run"
        )));
    }
    let path = write_html(&dir).map_err(|e| {
        let file = e.path.strip_prefix(&ctx.env.cwd).unwrap_or(&e.path);
        Error::usage(format!(
            "cannot build {HTML_FILE} for `{shown}`: {}: {}",
            file.display(),
            e.message
        ))
    })?;
    let written = path.strip_prefix(&ctx.env.cwd).unwrap_or(&path);
    ctx.out.write(&format!("{}\n", written.display()))?;
    Ok(())
}
