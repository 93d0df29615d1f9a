//! Streaming generation: prompt in, text pieces out.
