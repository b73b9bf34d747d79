"""A small application with background jobs: signing up sends a welcome email, which then updates the CRM."""
