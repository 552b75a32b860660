//! Blocking sends carried as streams: a blocking `SendMessage` whose caller
//! leaves has its child cancelled (issue: "No orphan in any call shape").
