package spin

// Pause executes the x86 PAUSE instruction: it tells the core this is a spin-wait loop,
// which saves power and frees resources for a sibling hyper-thread.
func Pause()
