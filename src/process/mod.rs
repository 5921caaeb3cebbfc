//! Other processes: whether one is alive, and the process groups summon started, killed
//! when summon is ended by a signal.

mod alive;
pub(crate) mod groups;

pub(crate) use alive::pid_alive;
