//! A concurrency slot a subagent can give back while it waits (a provider's `Retry-After`,
//! or a requests/tokens-per-minute budget), so waiting tasks do not keep others from running.

use std::future::Future;
use std::pin::Pin;

pub(crate) trait Slot: Send + Sync {
    /// Gives the slot back.
    fn release(&self);
    /// Takes a slot again (waits for one to be free).
    fn reacquire(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}
