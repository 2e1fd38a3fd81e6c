from services.webhook.service import main

main()
